#!/usr/bin/env bash
# The monthly update on a GPU, once, for real (docs/gpu.md): one prepared command, tried on the CPU first.
#
#   scripts/gpu-check.sh --pack             here, with the CPU install (.venv, make setup): build .gpu/, what travels
#                                           to the GPU machine: the Python packages it lacks (pinned by
#                                           constraints.txt, unpacked for CPython 3.12 x86-64, packed with xz), the
#                                           prepared month (benchmarks/gpu.py --prepare: pi_init, a simulated month
#                                           landed and ingested into DuckDB, the MLflow store), and this machine's
#                                           CPU run of the same rows (.gpu/cpu-here.json)
#   scripts/gpu-check.sh [--out DIR]        on the GPU machine: unpack .gpu/site.tar.xz first on PYTHONPATH, run
#                                           the CUDA pinned test (tests/train/test_cuda_pinned.py), then
#                                           benchmarks/gpu.py on CUDA (bf16) and on that machine's CPU (float32),
#                                           merged with .gpu/cpu-here.json; logs and JSON under DIR
#   scripts/gpu-check.sh --cpu [--smoke]    the same on the CPU only (no CUDA needed); --smoke at the smallest sizes
#                                           (seconds; the test suite runs `--cpu --smoke`)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CPU=0 SMOKE=0 PACK=0 OUT="${OUT:-$ROOT/gpu-check-out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --smoke) SMOKE=1 ;;
    --pack) PACK=1 ;;
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# What the GPU machine's image lacks for `abpo sft` / `abpo update` (read off its package list, docs/gpu.md), and the
# versions it has that abpo cannot use (transformers 5.17 and huggingface_hub 1.x: abpo needs transformers >= 5.23).
CARRY=(alembic annotated-types argcomplete cachetools cffi cryptography databricks-sdk datasets dill duckdb
  email-validator fastapi gitdb gitpython hjson httpcore2 httpx2 huggingface-hub importlib-metadata mako mlflow-skinny
  mlflow-tracing multiprocess opentelemetry-api opentelemetry-proto opentelemetry-sdk
  opentelemetry-semantic-conventions peft pydantic pydantic-core pydantic-extra-types python-multipart pytz
  rich-argparse smmap sniffio sqlalchemy sqlparse starlette transformers trl truststore typing-inspection)
PLATFORMS=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

if [ "$PACK" = 1 ]; then
  [ -x .venv/bin/python ] || { echo "gpu-check.sh --pack: run make setup first (.venv)" >&2; exit 2; }
  rm -rf .gpu && mkdir -p .gpu
  work="$(mktemp -d)"
  specs=()
  for p in "${CARRY[@]}"; do
    pat="^$(echo "$p" | sed 's/[-_.]/[-_.]/g')=="
    spec="$(grep -iE "$pat" constraints.txt | head -1 || true)"
    [ -n "$spec" ] || spec="$p"  # not in the CPU set (hjson: DeepSpeed's): the newest
    specs+=("$spec")
  done
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: "${PLATFORMS[@]}" -d "$work/wheels" "${specs[@]}"
  # DeepSpeed ships as source only: a pure-Python wheel (DS_BUILD_OPS=0: its CUDA ops build on first use, with the
  # GPU machine's nvcc)
  ds="$(grep -iE '^deepspeed==' constraints-gpu.txt | head -1)"
  .venv/bin/python -m pip download -q --no-deps --no-binary=:all: -d "$work/sdist" "$ds"
  DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheels" "$work"/sdist/*
  .venv/bin/python -m pip install -q --no-deps --no-compile --target "$work/site" "${PLATFORMS[@]}" \
    --only-binary=:all: "$work"/wheels/*.whl
  XZ_OPT="${XZ_OPT:--T0}" tar -cJf .gpu/site.tar.xz -C "$work/site" .
  rm -rf "$work"
  "$PY" benchmarks/gpu.py --state .gpu/state --prepare
  if [ "${GPU_CHECK_CPU_HERE:-1}" = 1 ]; then  # GPU_CHECK_CPU_HERE=0: no column of this machine's CPU
    "$PY" benchmarks/gpu.py --state .gpu/state --devices cpu --label "this machine" --json .gpu/cpu-here.json \
      2>&1 | tee "$OUT/cpu-here.log"
  fi
  du -sh .gpu/* && echo "gpu-check.sh --pack: .gpu/ ready; carry it: scripts/gpu-check.sh --out \$OUT on the GPU machine"
  exit 0
fi

if [ "$CPU" = 0 ] && [ -f .gpu/site.tar.xz ]; then  # (packages for the GPU machine's CPython 3.12, not this one)
  SITE="${TMPDIR:-/tmp}/abpo-gpu-site"
  rm -rf "$SITE" && mkdir -p "$SITE"
  tar -xJf .gpu/site.tar.xz -C "$SITE"
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
args=(--json "$OUT/gpu.json")
[ "$SMOKE" = 1 ] && args+=(--smoke)
if [ "$CPU" = 1 ]; then
  args+=(--devices cpu)
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check.sh: no CUDA device (use --cpu)')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt" || true
  args+=(--devices cuda cpu)
  [ -f .gpu/cpu-here.json ] && args+=(--merge .gpu/cpu-here.json)
fi
[ -d .gpu/state ] && [ "$SMOKE" = 0 ] && args+=(--state .gpu/state)
# shellcheck disable=SC2206  # GPU_CHECK_ARGS: more arguments of benchmarks/gpu.py, split on spaces (e.g. --steps 4)
args+=(${GPU_CHECK_ARGS:-})
"$PY" -c "import torch, transformers, trl, mlflow, duckdb; print('gpu-check.sh: python', __import__('sys').version.split()[0], \
'torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'mlflow', mlflow.__version__, \
'duckdb', duckdb.__version__)"
set -o pipefail
status=0
if [ "$CPU" = 0 ]; then  # the pinned test first: the shortest and the one a failure must not hide
  "$PY" -m pytest -p no:cacheprovider -q -s -rs tests/train/test_cuda_pinned.py 2>&1 | tee "$OUT/pinned.log" || status=$?
fi
# stdout (the table, its last line) and stderr (warnings, libraries' exit messages) stay apart, each also kept in $OUT
"$PY" benchmarks/gpu.py "${args[@]}" 2> >(tee "$OUT/gpu.err" >&2) | tee "$OUT/gpu.log" || status=$?
if [ "$CPU" = 1 ]; then
  echo "gpu-check.sh --cpu: tests/train/test_cuda_pinned.py needs CUDA; not run"
fi
exit "$status"
