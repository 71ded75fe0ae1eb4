#!/usr/bin/env bash
# Checks, with pip's resolver only, that abpo's `gpu` extra (vLLM, DeepSpeed) resolves against constraints-gpu.txt:
# `pip install --dry-run`, so nothing is installed and nothing runs on a GPU. Needs the package index (it fetches
# the candidates' metadata). Usage: scripts/check-gpu-constraints.sh [REPORT.json]   (pip's --report of the set)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
report=${1:-$(mktemp --suffix=.json)}
"$PY" -m pip install --dry-run --ignore-installed --quiet --report "$report" -c constraints-gpu.txt ".[gpu]"
"$PY" - "$report" <<'PY'
import json, sys
names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print("the gpu extra resolves:", ", ".join(f"{n} {names[n]}" for n in ("vllm", "deepspeed", "trl", "transformers", "torch")))
PY
