#!/usr/bin/env bash
# Issue 49's probes and test tables (benchmarks/which_update.py, docs/which-update.md) on a lent device machine's CPU
# cores, as one call of the device tool. What travels in .gpu/ (ignored by git), built here:
#
#   scripts/which-update-device.sh --pack STATE   here: .gpu/h49/ = implicit for CPython 3.12 (the device image lacks
#                                                 it), Office_Products from ../shared/data/amazon18 (read in place,
#                                                 never vendored), and STATE's pi_inits (trained here: the slowest
#                                                 part) with their shared logs; .gpu/site.tar.xz comes from
#                                                 scripts/gpu-check.sh --pack
#   scripts/which-update-device.sh [--budget S] [--waves W]   on the device machine: unpack, run which_update.py for
#                                                 at most S seconds (default 500) into $OUT/wu, then pack every
#                                                 finished cell into $OUT/cells.tar.gz (a rerun anywhere resumes
#                                                 from them: copy them into the state's experiments/)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUDGET=500 WAVES="probes,mixed_sim+stale_sim,today+diagnosis" PACK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) PACK="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    --waves) WAVES="$2"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "which-update-device.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "$PACK" ]; then
  set -e
  mkdir -p .gpu/h49
  work="$(mktemp -d)"
  spec="$(grep -iE '^implicit==' constraints.txt | head -1)"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$work/whl" "$spec"
  .venv/bin/python -m pip install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --only-binary=:all: "$work"/whl/*.whl
  tar -cJf .gpu/h49/implicit.tar.xz -C "$work/site" .
  # gpu-check.sh's packages less DeepSpeed and the Databricks SDK (unused here): the carry limit is 64 MiB
  mkdir -p "$work/gsite" && tar -xJf .gpu/site.tar.xz -C "$work/gsite"
  rm -rf "$work"/gsite/deepspeed "$work"/gsite/deepspeed-* "$work"/gsite/databricks "$work"/gsite/databricks_sdk-*
  XZ_OPT=-T0 tar -cJf .gpu/h49/site.tar.xz -C "$work/gsite" .
  (cd ../shared/data && tar -cJf "$ROOT/.gpu/h49/amazon18.tar.xz" amazon18/LICENSE.MiniOneRec amazon18/SOURCE_COMMIT \
    amazon18/*/Office_Products*)
  # the pi_inits and their logs; not stage 1's intermediate models nor the cells' update checkpoints
  tar -cJf .gpu/h49/state.tar.xz -C "$PACK" --exclude='*/checkpoint-*' --exclude='experiments/*/cells' --exclude='models/tiny-*' \
    --exclude='experiments/_cells' experiments
  rm -rf "$work"
  du -sh .gpu/h49/* .gpu/site.tar.xz
  exit 0
fi

OUT="${OUT:-$ROOT/which-update-device-out}"
mkdir -p "$OUT"
SITE="${TMPDIR:-/tmp}/abpo-h49-site" STATE="${TMPDIR:-/tmp}/abpo-h49-state"
rm -rf "$SITE" && mkdir -p "$SITE" "$STATE"
SITE_TAR=.gpu/site.tar.xz
[ -f .gpu/h49/site.tar.xz ] && SITE_TAR=.gpu/h49/site.tar.xz  # the same less DeepSpeed and the Databricks SDK
tar -xJf "$SITE_TAR" -C "$SITE" && tar -xJf .gpu/h49/implicit.tar.xz -C "$SITE"
tar -xJf .gpu/h49/state.tar.xz -C "$STATE"
[ -d ../shared/data/amazon18 ] || { mkdir -p ../shared/data && tar -xJf .gpu/h49/amazon18.tar.xz -C ../shared/data; }
export PYTHONPATH="$SITE:$ROOT" ABPO_STATE="$STATE" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
"$PY" -c "import sys, os, torch, transformers, trl, implicit; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())" | tee "$OUT/versions.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/versions.txt" || true
timeout "$BUDGET" "$PY" benchmarks/which_update.py --out "$OUT/wu" --waves "$WAVES" 2>&1 | tee "$OUT/which_update.log"
echo "which_update.py exit ${PIPESTATUS[0]} (124: stopped at the budget of ${BUDGET}s)" | tee -a "$OUT/which_update.log"
pkill -f 'from abpo.cli import main' 2>/dev/null; sleep 2  # the experiments a stopped run left behind
(cd "$STATE" && find experiments -path '*cells*' -name '*.json' -print0 | tar -czf "$OUT/cells.tar.gz" --null -T -)
ls -la "$OUT" "$OUT/wu" 2>/dev/null | head -40
