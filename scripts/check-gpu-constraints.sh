#!/usr/bin/env bash
# Checks that abpo's `gpu` extra (vLLM, DeepSpeed) resolves against constraints-gpu.txt, with a resolver only:
# nothing is installed and nothing runs on a GPU. Needs the package index (it fetches the candidates' metadata).
# Usage: scripts/check-gpu-constraints.sh [PINS.txt]   (the resolved set, one `name==version` a line)
#
# The resolver is uv's (`uv pip compile`, uv pinned in constraints.txt and installed by scripts/setup.sh): about 3 s
# where pip's (`pip install --dry-run --report`) took about 75 CPU-seconds on 2 cores, the same set resolved (vllm
# 0.30.0, deepspeed 0.19.8, trl 1.16.0, transformers 5.23.0, torch 2.13.0 on 2026-11-29). ABPO_INSTALLER=pip uses
# pip's, as a user's `pip install -c constraints-gpu.txt ".[gpu]"` does. Like scripts/setup.sh, it hands pip's
# find-links and certificate bundle to uv (scripts/uv-pip-config.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pins=${1:-$(mktemp --suffix=.txt)}
uv=$(dirname "$PY")/uv
if [ "${ABPO_INSTALLER:-uv}" = uv ] && [ -x "$uv" ]; then
    source scripts/uv-pip-config.sh
    uv_pip_config "$PY"  # sets links, exports SSL_CERT_FILE
    "$uv" pip compile --quiet --python "$PY" "${links[@]}" -c constraints-gpu.txt --extra gpu \
        --no-annotate --no-header -o "$pins" pyproject.toml
    echo "resolver: uv pip compile"
else
    report=$(mktemp --suffix=.json)
    "$PY" -m pip install --dry-run --ignore-installed --quiet --report "$report" -c constraints-gpu.txt ".[gpu]"
    "$PY" - "$report" "$pins" <<'PY'
import json, sys
got = json.load(open(sys.argv[1]))["install"]
open(sys.argv[2], "w").write("".join(f"{i['metadata']['name']}=={i['metadata']['version']}\n" for i in got))
PY
    echo "resolver: pip install --dry-run"
fi
"$PY" - "$pins" <<'PY'
import re, sys
names = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if "==" in line:
        name, version = line.split("==", 1)
        names[re.sub(r"[-_.]+", "-", name).lower()] = version.split(";", 1)[0].strip()
print("the gpu extra resolves:", ", ".join(f"{n} {names[n]}" for n in ("vllm", "deepspeed", "trl", "transformers", "torch")))
PY
