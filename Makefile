# The two commands a new user needs (see README):
#   make demo   set everything up and run the main job end to end on the embedded defaults
#   make test   set everything up and run the whole test suite
.PHONY: setup demo test test-fast
setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/abpo demo --config demo

test: setup
	bash scripts/setup-browser.sh
	bash scripts/setup-redis.sh
	ABPO_REQUIRE_BROWSER=1 ABPO_REQUIRE_REDIS=1 .venv/bin/python -m pytest

test-fast: setup
	.venv/bin/python -m pytest -m "not slow"
