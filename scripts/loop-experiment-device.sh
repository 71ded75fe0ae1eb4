#!/usr/bin/env bash
# The replicated loop experiment (abpo loop-experiment, docs/report.md) on a lent device machine's CPU cores, as
# one or two calls of the device tool: the replicates run one per core there instead of two at a time here.
# What travels in .gpu/le/ (ignored by git), built here:
#
#   scripts/loop-experiment-device.sh --pack      here: .gpu/le/site.tar.xz = the pinned packages the device image
#                                                 lacks (constraints.txt, for CPython 3.12 x86-64): those
#                                                 `abpo loop-experiment` imports, read off a traced run
#                                                 (LE_DEVICE_MODULES: one top-level module per line), and
#                                                 .gpu/le/src.tar.xz = the code that runs there, a commit's
#                                                 (LE_DEVICE_REV, default HEAD), not the working tree
#   scripts/loop-experiment-device.sh --start [ARGS...]   on the device machine: unpack, check the imports, start
#                                                 `abpo loop-experiment --config demo ARGS` in its own session (it
#                                                 outlives the call while the machine stays warm), then --wait
#   scripts/loop-experiment-device.sh --wait S    on the device machine: follow it for at most S seconds, then copy
#                                                 the report and every finished replicate's result into $OUT
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
RUN_DIR="${LE_DEVICE_DIR:-/root/abpo-le}"   # the state there: outlives a call, not the machine
SITE="$RUN_DIR/site"
PY="${PYTHON:-python3}"

pack() {
  set -e
  [ -f "${LE_DEVICE_MODULES:-}" ] || { echo "--pack: LE_DEVICE_MODULES=<file of top-level modules> (a traced run)" >&2; exit 2; }
  mkdir -p .gpu/le
  work="$(mktemp -d)"
  # the distributions that provide the traced modules, less those the device image has (KINDS.md's list)
  .venv/bin/python - "$LE_DEVICE_MODULES" "${LE_DEVICE_HAS:?LE_DEVICE_HAS=<file of the image packages>}" >"$work/specs" <<'PY'
import importlib.metadata as md, re, sys
mods = [m.strip() for m in open(sys.argv[1]) if m.strip()]
have = {re.sub(r"[-_.]+", "-", p.strip().lower()) for p in open(sys.argv[2]) if p.strip()}
have -= {"transformers", "huggingface-hub"}  # the image's are older than abpo needs (docs/gpu.md)
dists = md.packages_distributions()
pins = {}
for line in open("constraints.txt"):
    m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
    if m:
        pins[re.sub(r"[-_.]+", "-", m.group(1).lower())] = m.group(2)
need = set()
for mod in mods:
    for d in dists.get(mod, []):
        need.add(re.sub(r"[-_.]+", "-", d.lower()))
# and what those need, transitively, as installed here
todo = list(need)
while todo:
    d = todo.pop()
    try:
        reqs = md.requires(d) or []
    except md.PackageNotFoundError:
        continue
    for r in reqs:
        if "extra ==" in r:
            continue
        name = re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower())
        if name and name not in need:
            need.add(name)
            todo.append(name)
skip = {"torch", "abpo", "deepspeed", "nvidia-nccl-cu12", "triton", "psycopg2-binary", "hjson", "boto3", "botocore", "s3transfer", "jmespath"} | {d for d in need if d.startswith("nvidia-")}
for d in sorted(need - have - skip):
    if d in pins:
        print(f"{d}=={pins[d]}")
    else:
        print(d, file=sys.stderr)
PY
  echo "--pack: $(wc -l <"$work/specs") distributions to carry: $(tr "\n" " " <"$work/specs")"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work/whl" -r "$work/specs"
  .venv/bin/python -m pip install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --only-binary=:all: "$work"/whl/*.whl
  XZ_OPT=-T0 tar -cJf .gpu/le/site.tar.xz -C "$work/site" .
  git archive "${LE_DEVICE_REV:-HEAD}" abpo configs sql data pyproject.toml | xz -T0 >.gpu/le/src.tar.xz
  git rev-parse "${LE_DEVICE_REV:-HEAD}" >.gpu/le/src.rev
  rm -rf "$work"
  du -sh .gpu/le/*
}

follow() {  # $1: seconds at most; copies what is finished into $OUT
  local until=$(( $(date +%s) + $1 ))
  local le="$RUN_DIR/state/loop-experiment"
  while [ "$(date +%s)" -lt "$until" ]; do
    if ! pgrep -f "abpo.cli loop-experiment" >/dev/null; then break; fi
    sleep 10
  done
  mkdir -p "$OUT/le"
  tail -n 40 "$RUN_DIR/run.log" | tee "$OUT/le/run-tail.log"
  cp "$RUN_DIR/run.log" "$OUT/le/run.log" 2>/dev/null
  # every finished replicate's result (small) and the report, if written
  (cd "$le" 2>/dev/null && find replicates -maxdepth 2 \( -name result.json -o -name months.json \) -print0 \
    | tar -czf "$OUT/le/results.tar.gz" --null -T -) || true
  find "$le/reports" -name 'report.*' -exec cp {} "$OUT/le/" \; 2>/dev/null || true
  ls -la "$OUT/le"
  pgrep -f "abpo.cli loop-experiment" >/dev/null && echo "loop-experiment-device.sh: still running" || \
    echo "loop-experiment-device.sh: finished"
}

case "${1:-}" in
  --pack) pack ;;
  --start)
    shift
    mkdir -p "$SITE" "$RUN_DIR/state" "$RUN_DIR/src"
    tar -xJf .gpu/le/site.tar.xz -C "$SITE"
    tar -xJf .gpu/le/src.tar.xz -C "$RUN_DIR/src" && cp .gpu/le/src.rev "$RUN_DIR/src/"
    mkdir -p "$OUT" && cp .gpu/le/src.rev "$OUT/"
    cd "$RUN_DIR/src"
    export PYTHONPATH="$SITE:$RUN_DIR/src" ABPO_STATE="$RUN_DIR/state" PYTHONUNBUFFERED=1
    "$PY" -c "import sys, os, torch, transformers, trl, mlflow, duckdb, implicit, great_expectations, abpo.cli; \
print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, \
'cores', os.cpu_count())" 2>&1 | tee "$OUT/versions.txt" || exit 3
    lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/versions.txt" || true
    setsid nohup "$PY" -m abpo.cli loop-experiment --config demo "$@" >"$RUN_DIR/run.log" 2>&1 < /dev/null &
    sleep 5
    follow "${LE_DEVICE_WAIT:-500}"
    ;;
  --wait) follow "${2:-500}" ;;
  -h|--help|"") sed -n '2,16p' "$0" ;;
  *) echo "loop-experiment-device.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
