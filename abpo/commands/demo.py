"""`abpo demo`: the main job end to end on the embedded defaults.

    prepare -> bootstrap (pi_init SFT, every arm's first champion; abpo.monthly.bootstrap) -> for each of the months:
    `airflow dags test abpo_monthly` with simulate=true (the monthly steps as tasks: serve -> ingest -> per-arm
    update, register, gate, promote, refit -> report) -> the final report's summary

The console view: the demo's own steps (StepLog) and, from each month's Airflow run, the lines the tasks log through
the ``abpo`` loggers (abpo.logs.console marks them with abpo.monthly.local_airflow.TASK_LINE on the tasks' stdout, the
demo shows them without it); Airflow's own output goes to the month's log file. The demo's Airflow (its environment,
airflow.cfg, the month runs, the UI's command) is abpo.monthly.local_airflow; the data's counts abpo.data.prepare.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import count_arg

if TYPE_CHECKING:
    from abpo.config import Config


@dataclass
class StepLog:
    """What the demo did, step by step: printed as it goes and saved as JSON at the end."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, seconds: float, **produced: Any) -> None:
        row = {"step": name, "seconds": round(seconds, 1), **{k: _plain(v) for k, v in produced.items()}}
        self.steps.append(row)
        shown = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("step", "seconds"))
        print(f"[{name}] done in {seconds:.1f}s: {shown}", flush=True)

    def run(self, name: str, fn, *args: Any, describe=None, **kwargs: Any) -> Any:
        """Time ``fn(*args, **kwargs)`` and log what it produced (its dict, or ``describe(result)``)."""
        print(f"[{name}] ...", flush=True)
        t = time.time()
        result = fn(*args, **kwargs)
        self.add(name, time.time() - t, **(describe(result) if describe else result))
        return result


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
    log = StepLog()
    # refused here, before anything runs, not in month 1's run
    dag_overrides = local_airflow.month_run_overrides(args.overrides)
    months = month_range(cfg.sim.start_month, args.months)
    root = cfg.paths.resolve("root")
    print(f"abpo demo: config {cfg.name}, months {months[0]}..{months[-1]}, state under {root}", flush=True)

    log.run("prepare", prepare_counts, cfg.data)
    arms = log.run("bootstrap", bootstrap_arms, cfg, describe=lambda r: r.arms).arms
    env = local_airflow.airflow_env(cfg, args.config)
    log.run("airflow_db", local_airflow.init_airflow_db, env, root, _echo)
    for m in months:
        log.run(f"month {m}", local_airflow.month_through_airflow, env, m, dag_overrides, root, _echo)

    with quiet("abpo.monthly.report"):  # the last month's task already logged this report
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
    return 0
