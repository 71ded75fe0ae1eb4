"""`abpo demo`: the main job end to end on the embedded defaults.

    prepare -> bootstrap (pi_init SFT, every arm's first champion; abpo.monthly.bootstrap) -> for each of the months:
    `airflow dags test abpo_monthly` with simulate=true (the monthly steps as tasks: serve -> ingest -> per-arm
    update, register, gate, promote, refit -> report) -> the final report's summary

The console view: one line as each stage starts, with the time elapsed and an estimate of what remains
(:class:`Progress`), the same on a terminal and in a file; then the final report's summary. Each stage's detail goes
to its step log: the in-process stages' (prepare, bootstrap, the final report: abpo's lines, the libraries' output
such as transformers' logged steps and MLflow's) to ``<state>/demo-logs/<stage>.log`` (abpo.logs.step_log), each
Airflow run's to its file under ``<state>/airflow/`` with the tasks' own lines marked by
abpo.monthly.local_airflow.TASK_LINE. ``-v`` shows all of it on the console as well (the tasks' lines without the
mark). The demo's Airflow (its environment, airflow.cfg, the month runs, the UI's command) is
abpo.monthly.local_airflow; the data's counts abpo.data.prepare.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import count_arg

if TYPE_CHECKING:
    from abpo.config import Config


# Each stage's seconds in `make demo` (`abpo demo --config demo`, four months) on a quiet 2-core machine, the share
# of a run from which the console's estimate of what remains starts. Source: docs/experiments/2026-11-demo-runs.md,
# "How long it takes", the two fresh-clone runs of the current loop (the demo 14.1 and 14.4 min; bootstrap 333.8 and
# 326.8 s; months 117.0 to 145.4 s, 129.1 s on average); prepare is that page's 4.0 s of another run. The Airflow
# database and the final report were not timed apart: together they are the rest of those runs (about 4 s).
STAGE_SECONDS = {"prepare": 4.0, "bootstrap": 330.3, "airflow_db": 3.0, "month": 129.1, "final_report": 1.0}
# How many seconds of the measured run the first stages' own pace is weighed against: a 4 s prepare that ran in 2 s
# must not halve the estimate of a 14-minute run.
PRIOR_SECONDS = 60.0


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on) of a duration."""
    s = max(0, int(round(seconds)))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def left(seconds: float) -> str:
    """The estimate of what remains, in words: ``about 8 min left``."""
    if seconds < 60:
        return "under a minute left"
    return f"about {round(seconds / 60)} min left"


def progress_line(label: str, elapsed: float, remaining: float) -> str:
    """One stage's console line: ``month 2 of 4 (2026-02) ... 9:40 elapsed, about 8 min left``."""
    return f"{label} ... {clock(elapsed)} elapsed, {left(remaining)}"


def estimate_remaining(
    todo: list[str], done: list[tuple[str, float]], expected: dict[str, float] = STAGE_SECONDS
) -> float:
    """Seconds left for the stages ``todo`` (their kinds): their measured seconds (``expected``), scaled by how this
    run's stages ``done`` ((kind, seconds) each) compare with theirs, the measured run weighing
    :data:`PRIOR_SECONDS` (so one short stage moves the estimate little, the bootstrap a lot)."""
    pace = (sum(s for _, s in done) + PRIOR_SECONDS) / (sum(expected[k] for k, _ in done) + PRIOR_SECONDS)
    return pace * sum(expected[k] for k in todo)


@dataclass
class Progress:
    """Where the demo is: :meth:`start` gives each stage's console line (:func:`progress_line`), :meth:`finish` what
    it took. ``stages``: (kind of :data:`STAGE_SECONDS`, label) in the order they run."""

    stages: list[tuple[str, str]]
    t0: float = field(default_factory=time.time)
    done: list[tuple[str, float]] = field(default_factory=list)

    def start(self, now: float | None = None) -> str:
        """The console line of the next stage to run."""
        now = time.time() if now is None else now
        label = self.stages[len(self.done)][1]
        todo = [k for k, _ in self.stages[len(self.done) :]]
        return progress_line(label, now - self.t0, estimate_remaining(todo, self.done))

    def finish(self, seconds: float) -> None:
        self.done.append((self.stages[len(self.done)][0], seconds))


def demo_stages(months: Sequence[str]) -> list[tuple[str, str]]:
    """The demo's stages, (kind, label) each, for :class:`Progress`."""
    return [
        ("prepare", "prepare the data"),
        ("bootstrap", "bootstrap: pi_init and every arm's first champion"),
        ("airflow_db", "the demo's Airflow database"),
        *(("month", f"month {i} of {len(months)} ({m}) through abpo_monthly") for i, m in enumerate(months, 1)),
        ("final_report", "the final report"),
    ]


@dataclass
class StepLog:
    """What the demo did, step by step: each stage's line on the console as it starts (:class:`Progress`), saved as
    JSON at the end. ``verbose``: also each stage's outcome, ``[name] done in ...``."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    progress: Progress | None = None
    verbose: bool = False

    def add(self, name: str, seconds: float, **produced: Any) -> None:
        row = {"step": name, "seconds": round(seconds, 1), **{k: _plain(v) for k, v in produced.items()}}
        self.steps.append(row)
        if self.verbose:
            shown = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("step", "seconds"))
            print(f"[{name}] done in {seconds:.1f}s: {shown}", flush=True)

    def run(self, name: str, fn, *args: Any, describe=None, step_log: Path | None = None, **kwargs: Any) -> Any:
        """Time ``fn(*args, **kwargs)`` and log what it produced (its dict, or ``describe(result)``); with
        ``step_log`` its output goes to that file (abpo.logs.step_log; also on the console when ``verbose``)."""
        if self.progress is not None:
            print(self.progress.start(), flush=True)
        t = time.time()
        with _routed(step_log, self.verbose):
            result = fn(*args, **kwargs)
        seconds = time.time() - t
        if self.progress is not None:
            self.progress.finish(seconds)
        self.add(name, seconds, **(describe(result) if describe else result))
        return result


def _routed(path: Path | None, verbose: bool):
    import contextlib

    from abpo.logs import step_log

    return contextlib.nullcontext() if path is None else step_log(path, echo=verbose)


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


# ------------------------------------------------------------------------------------------------ abpo demo


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="Run the production loop end to end on the embedded defaults: four simulated months through Airflow.",
        description="Run the main job end to end on the embedded defaults (bundled MovieLens, DuckDB, SQLite-backed "
        "Airflow and MLflow, the tiny CPU model; use --config demo for the preset sized for 2 cores): prepare the "
        "data, bootstrap pi_init and every arm's first champion, then run MONTHS simulated months (from "
        "sim.start_month) through the abpo_monthly DAG with `airflow dags test` (serve -> ingest + GX -> each LLM "
        "arm updated from its champion on the month's logs (arms.update_logs), gated, promoted -> ranker refits -> "
        "the holdback held at pi_init -> A/B report), and print "
        "the final report's summary, where the HTML report, the Airflow UI and the MLflow UI are, and the wall time.",
    )
    p.add_argument(
        "--months", type=count_arg("--months", "months"), default=4, help="Simulated months to run (default: 4)."
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="Show every stage's detail on the console too (abpo's own lines, the Airflow tasks' lines, the "
        "libraries' output); without it the console has one line per stage and the summary, the detail is in the "
        "step logs (<state>/demo-logs/, <state>/airflow/*.log).",
    )
    p.set_defaults(handler=run_demo)
    # `abpo loop-experiment`, the demo's loop replicated, registers beside it (it belongs in abpo.cli.COMMAND_MODULES,
    # which another change holds at the time of writing)
    from abpo.commands import loop_experiment

    loop_experiment.register(sub, common)


def _echo(line: str) -> None:
    """What the demo's Airflow runs show on the console: the tasks' own lines, a failed run's last lines."""
    print(line, flush=True)


def run_demo(args: argparse.Namespace, cfg: Config) -> int:
    import json as _json

    from abpo.data.prepare import prepare_counts
    from abpo.logs import quiet
    from abpo.monthly import local_airflow
    from abpo.monthly.bootstrap import bootstrap_arms
    from abpo.monthly.report import report
    from abpo.months import month_range

    t0 = time.time()
    verbose = bool(getattr(args, "verbose", False))
    # refused here, before anything runs, not in month 1's run
    dag_overrides = local_airflow.month_run_overrides(args.overrides)
    months = month_range(cfg.sim.start_month, args.months)
    root = cfg.paths.resolve("root")
    logs = root / "demo-logs"
    progress = Progress(demo_stages(months), t0=t0)
    log = StepLog(progress=progress, verbose=verbose)
    print(f"abpo demo: config {cfg.name}, months {months[0]}..{months[-1]}, state under {root}", flush=True)
    if not verbose:
        print(f"abpo demo: each stage's detail goes to its log ({logs}, {root / 'airflow'}); -v shows it here too")

    log.run("prepare", prepare_counts, cfg.data, step_log=logs / "prepare.log")
    arms = log.run("bootstrap", bootstrap_arms, cfg, describe=lambda r: r.arms, step_log=logs / "bootstrap.log").arms
    env = local_airflow.airflow_env(cfg, args.config)
    log.run("airflow_db", local_airflow.init_airflow_db, env, root, _echo, task_lines=verbose)
    for m in months:
        log.run(
            f"month {m}", local_airflow.month_through_airflow, env, m, dag_overrides, root, _echo, task_lines=verbose
        )

    print(progress.start(), flush=True)  # the final report: the last stage, not a step of the step log
    with _routed(logs / "report.log", verbose), quiet("abpo.monthly.report"):  # the last month's task logged it
        final = report(cfg, months[-1]).to_json()
    md = Path(final["markdown"]).read_text()
    summary = md.split("## Summary", 1)[-1].split("\n## ", 1)[0].strip()
    out = root / "demo_summary.json"
    out.write_text(_json.dumps({"steps": log.steps, "arms": arms, "report": final}, indent=1, default=str))
    wall = time.time() - t0
    print(f"\nabpo demo: {len(months)} months through abpo_monthly in {wall / 60:.1f} min wall time")
    print(f"\nFinal A/B report ({final['months'][0]}..{final['months'][-1]}), summary:\n{summary}\n")
    print(f"  HTML report    {final['html']}")
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    print("  Airflow UI     the runs of abpo_monthly, the A/B reports under /abpo/reports/: start it with")
    print(f"                   {local_airflow.standalone_command(env)}")
    print(
        f"                 then open http://127.0.0.1:8080 as admin (the password: {passwords}, or printed on the "
        "first start)"
    )
    print(
        f"  MLflow UI      .venv/bin/mlflow ui --backend-store-uri {cfg.paths.tracking_uri()}  -> http://localhost:5000 "
        "(models abpo-arm-*: champion / challenger, lineage tags)"
    )
    print(f"  warehouse      {cfg.paths.resolve('warehouse')}")
    print(f"  step log       {out}")
    print(f"  stage logs     {logs}/*.log, {root / 'airflow'}/*.log")
    return 0
