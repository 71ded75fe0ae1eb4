# The two commands a new user needs (see README):
#   make demo   set everything up and run the main job end to end on the embedded defaults
#   make test   set everything up (with the distributed extra) and run the whole test suite on 2 processes (the 15
#               slowest tests listed at the end)
#   make test-fast   while working: the tests not marked slow (everything but the end-to-end runs) on the same
#                    TEST_WORKERS processes, under 10 minutes on 2 cores (docs/testing.md)
# Habits (the same checks tests/test_lint.py runs; .pre-commit-config.yaml runs them on each commit):
#   make format               ruff format, then ruff check --fix (the whole tree)
#   make lint                 ruff check, ruff format --check, lint-imports (the layer contracts)
#   make typecheck            mypy over abpo/, its error count held at tests/typecheck_baseline.txt's
#   make typecheck-baseline   record today's mypy count in tests/typecheck_baseline.txt (after fixing errors)
.PHONY: setup demo test test-fast format lint typecheck typecheck-baseline
DURATIONS = --durations=15
# make test and make test-fast run on TEST_WORKERS pytest-xdist processes (--dist load --maxschedchunk 1: each worker takes the next
# test from the front of the list when it has fewer than two; tests/conftest.py puts the longest tests first).
# TEST_WORKERS=0 runs the suite in one process (docs/testing.md).
TEST_WORKERS ?= 2
# make test also installs the `distributed` extra (DeepSpeed, source-only, nothing compiled: seconds with uv), so that
# the ZeRO-2 test runs (ABPO_REQUIRE_DEEPSPEED=1 fails it rather than skip it); make setup and make demo do not.
TEST_EXTRAS ?= distributed

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/abpo demo --config demo

test:
	ABPO_EXTRAS=$(TEST_EXTRAS) bash scripts/setup.sh
	bash scripts/setup-browser.sh
	bash scripts/setup-redis.sh
	ABPO_REQUIRE_BROWSER=1 ABPO_REQUIRE_REDIS=1 ABPO_REQUIRE_DEEPSPEED=1 .venv/bin/python -m pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 1 $(DURATIONS)

test-fast: setup
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist load -m "not slow" $(DURATIONS)

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

typecheck: setup
	.venv/bin/python scripts/typecheck.py

typecheck-baseline: setup
	.venv/bin/python scripts/typecheck.py --write-baseline
