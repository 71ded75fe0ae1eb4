"""What a monthly task pays to start, with and without the forkserver preload (abpo.monthly.preload; docs/operations.md,
"Task start-up"), measured side by side in one run.

A task of abpo_monthly imports what its step needs (torch, transformers, PEFT, MLflow, DuckDB, pyarrow, Great
Expectations, abpo's modules) before it does any work. Two ways to start N such tasks, alternated so that the
machine's load falls on both alike:

    cold     a new interpreter per task (`python -c "import <the step's modules>"`): what a task forked from a
             LocalExecutor worker that imported nothing pays
    preload  os.fork() from one process that imported abpo.monthly.preload once, the child importing the same
             modules (already in sys.modules: nothing left to load), as Airflow's forkserver preload gives a task

Each start is timed from launch to the child's exit (wall) and by the child's CPU time. The last line:

    task start-up cold/preload: wall <x>x, CPU <y>x (<N> starts each; preload paid once: <s> s)

    .venv/bin/python benchmarks/task_startup.py [--starts 6] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

# what the heaviest steps import when they run (serve, update, gate: the policy, the registry, the warehouse;
# ingest: the validation suite)
STEP_MODULES = (
    "torch",
    "transformers",
    "peft",
    "mlflow",
    "duckdb",
    "pyarrow.parquet",
    "great_expectations",
    "abpo.monthly.serve",
    "abpo.monthly.update",
    "abpo.monthly.gate",
    "abpo.monthly.ingest",
    "abpo.arms.versions",
    "abpo.policy.model",
)
# --smoke: the same two ways on two light modules, preloaded directly (seconds; the figures mean nothing)
SMOKE_MODULES = ("duckdb", "abpo.months")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cold_start(modules: tuple[str, ...]) -> tuple[float, float]:
    """A new interpreter importing ``modules``: (wall s, CPU s)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True)
    return time.perf_counter() - t0, _children_cpu() - cpu0


def forked_start(modules: tuple[str, ...]) -> tuple[float, float]:
    """A child forked from this (preloaded) process importing ``modules``: (wall s, CPU s)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: what a task forked from a preloaded worker does first
        code = 0
        try:
            import importlib

            for m in modules:
                importlib.import_module(m)
        except BaseException:  # noqa: BLE001 - reported through the exit code
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"a forked start failed to import {modules}")
    return time.perf_counter() - t0, _children_cpu() - cpu0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=6, help="task starts per way (default 6)")
    ap.add_argument(
        "--smoke", action="store_true", help="2 starts each of two light modules, preloaded directly: seconds"
    )
    args = ap.parse_args(argv)
    n = 2 if args.smoke else args.starts
    if n < 1:
        ap.error(f"--starts {n}: rule: at least 1")

    import importlib

    modules = SMOKE_MODULES if args.smoke else STEP_MODULES
    t0 = time.perf_counter()
    if args.smoke:
        for m in modules:
            importlib.import_module(m)
        count = len(modules)
    else:
        count = len(importlib.import_module("abpo.monthly.preload").PRELOADED)
    paid = time.perf_counter() - t0
    missing = [m for m in modules if m not in sys.modules]
    if missing:
        raise SystemExit(f"abpo.monthly.preload did not import {missing}: the benchmark would time their loading")
    print(f"preload: {count} modules in {paid:.1f} s (once, in the forkserver)")
    cold, warm = [], []
    for i in range(n):
        cold.append(cold_start(modules))
        warm.append(forked_start(modules))
        print(
            f"start {i + 1}: cold {cold[-1][0]:.2f} s wall, {cold[-1][1]:.2f} s CPU; "
            f"preload {warm[-1][0]:.3f} s wall, {warm[-1][1]:.3f} s CPU",
            flush=True,
        )
    wall = sum(w for w, _ in cold) / max(sum(w for w, _ in warm), 1e-9)
    cpu = sum(c for _, c in cold) / max(sum(c for _, c in warm), 1e-3)
    print(
        f"task start-up cold/preload: wall {wall:.0f}x, CPU {cpu:.0f}x ({n} starts each; preload paid once: {paid:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
