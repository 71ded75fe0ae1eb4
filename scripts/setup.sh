#!/usr/bin/env bash
# Creates .venv and installs abpo with the pinned, tested dependency set (constraints.txt).
# Idempotent: re-running after a successful install only re-checks the stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.abpo-installed
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "[setup] creating .venv with $($PY --version) and installing abpo (pinned by constraints.txt)"
[ -d .venv ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev]"
echo "$want" > "$stamp"
echo "[setup] done: $(.venv/bin/abpo --version)"
