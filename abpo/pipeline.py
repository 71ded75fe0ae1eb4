"""The shared steps of the pipeline (data preparation, pi_init, ingest + validation) and `abpo demo`: the main job
end to end on the embedded defaults.

    abpo demo:  prepare -> bootstrap (pi_init SFT, every arm's first champion) -> for each of three months:
                `airflow dags test abpo_monthly` with simulate=true (serve -> ingest -> per-arm update, gate,
                promote, refit -> report; abpo.arms.cycle) -> the final report's summary

Each step takes the loaded :class:`abpo.config.Config` and returns what it produced, so an orchestrator (the
Airflow DAG, a notebook, the demo) only wires them. Re-running a month is idempotent on the data side (the landed
part and the warehouse partition are replaced).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


# ------------------------------------------------------------------------------------------------ the steps


def prepare_data(cfg) -> dict[str, Any]:
    """Load the dataset and split it (ABPO_SPEC.md "Offline construction"); counts for the log."""
    from abpo.data.candidates import assert_target_held_out, build_bandit_requests, build_sup_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    sup = build_sup_examples(splits, ds, cfg.data)
    bandit = build_bandit_requests(splits, ds, cfg.data)
    checked = assert_target_held_out(splits, sup, bandit)
    return {
        "dataset": ds.name,
        "items": ds.catalog.num_rows,
        "interactions": ds.interactions.num_rows,
        "users_kept": report.users_kept,
        "users_skipped": dict(report.skipped),
        "d_sup": len(sup),
        "bandit_requests": len(bandit),
        "held_out_checked_prompts": checked,
    }


def pi_init_dir(cfg) -> Path:
    return cfg.paths.resolve("models") / cfg.sft.output


def ensure_pi_init(cfg, *, fresh: bool = False) -> dict[str, Any]:
    """Train pi_init by SFT on D_sup and register it (alias pi_init; champion only when none exists), unless a
    registered pi_init exists and ``fresh`` is not set: then it is reused, downloaded from the registry when the
    local directory is missing (a fresh worker), never retrained behind the registry's back. A registry that cannot
    answer raises (abpo.registry.RegistryUnavailable)."""
    from abpo import registry
    from abpo.arms.cycle import task_key
    from abpo.policy.sft import PI_INIT_ALIAS, train_sft

    registry.configure(cfg)
    # the SFT runs under a task key (abpo.registry.completed_task_run): an attempt killed mid-SFT (a lost worker, a
    # task the scheduler reset) left its run RUNNING; the next call marks it KILLED, whether it retrains or reuses
    key = task_key(cfg, "sft", "pi_init")
    registry.completed_task_run(cfg, cfg.sft.experiment, key)
    existing = registry.get_version(PI_INIT_ALIAS)
    if existing is not None and not fresh:
        local = pi_init_dir(cfg)
        if not (local / "config.json").exists():
            local = registry.download_model_dir(cfg, str(existing.version),
                                                dst=cfg.paths.resolve("models") / "registry" / f"pi_init-v{existing.version}")
        return {"model_dir": local, "model_version": existing.version, "reused": True}
    res = train_sft(cfg, run_tags={registry.TASK_KEY_TAG: key})
    if res.mlflow_run_id:
        registry.record_task_result(res.mlflow_run_id, {"model_version": str(res.model_version),
                                                        "model_dir": str(res.model_dir)})
    return {
        "model_dir": res.model_dir,
        "model_version": res.model_version,
        "mlflow_run": res.mlflow_run_id,
        "reused": False,
        "metrics": {k: float(v) for k, v in (res.metrics or {}).items()},  # on the seeded held-out users
    }


def ingest_and_validate(cfg, month: str, *, force: bool = False) -> dict[str, Any]:
    """Write, audit, publish the month's landing files (abpo.warehouse.Warehouse.ingest_month): contract violations
    quarantined, the replace guard and the Great Expectations suite run on the staged rows, and only then the
    month's partition is replaced. A failed audit raises IngestRefused and leaves the partition as it was."""
    from abpo.warehouse import ingest_with_config

    report, _ = ingest_with_config(cfg, month, force=force)  # every contract and audit setting of section data
    summary = report.audit
    return {
        "rows_in": report.rows_in,
        "rows_clean": report.rows_clean,
        "quarantined": dict(report.quarantined_by_rule),
        "validation": summary.path,
        "warehouse": cfg.paths.resolve("warehouse"),
    }


# ------------------------------------------------------------------------------------------------ abpo demo




def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="Run the production loop end to end on the embedded defaults: three simulated months through Airflow.",
        description="Run the main job end to end on the embedded defaults (bundled MovieLens, DuckDB, SQLite-backed "
        "Airflow and MLflow, the tiny CPU model; use --config demo for the preset sized for 2 cores): prepare the "
        "data, bootstrap pi_init and every arm's first champion, then run MONTHS simulated months (from "
        "sim.start_month) through the abpo_monthly DAG with `airflow dags test` (serve -> ingest + GX -> each LLM "
        "arm updated from its champion on its own logs, gated, promoted -> ranker refits -> A/B report), and print "
        "the final report's summary, where the HTML report, the Airflow UI and the MLflow UI are, and the wall time.",
    )
    p.add_argument("--months", type=int, default=3, help="Simulated months to run (default: 3).")
    p.set_defaults(handler=run_demo)


def airflow_env(cfg, config_ref: str) -> dict[str, str]:
    """The environment of the demo's Airflow: SQLite metadata under <state>/airflow, this repo's DAGs and plugins,
    the demo's config and state for the tasks."""
    import os

    from abpo.config import REPO_ROOT, preset_path

    ref = preset_path(config_ref)
    env = {**os.environ,
           "AIRFLOW_HOME": str(cfg.paths.resolve("root") / "airflow"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
           "ABPO_CONFIG": str(ref.resolve()) if ref.exists() else config_ref,
           "ABPO_STATE": str(cfg.paths.resolve("root")),
           "ABPO_TASK_RETRIES": "0"}
    if cfg.paths.mlflow_tracking_uri:
        env["ABPO_TRACKING_URI"] = cfg.paths.mlflow_tracking_uri
    return env


_SHOWN = ("simulate ", "  serve ", "  abpo ", "  grpo ", "  ml_retrain ", "  popularity ", "update ", "register ",
          "gate ", "promote ", "refit ", "report ", "  scored ")


def _run_airflow(args: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run the `airflow` CLI of this environment, the whole output into ``log_path``; the pipeline's own step lines
    (and the last lines on a failure) are echoed."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("airflow")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with log_path.open("w") as log, subprocess.Popen([str(exe), *args], env=env, stdout=subprocess.PIPE,
                                                     stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith(_SHOWN):  # the tasks' own prints reach the output unprefixed
                print("   " + line.rstrip(), flush=True)
    if proc.returncode != 0:
        print("\n".join(tail))
    return proc.returncode


def run_demo(args: argparse.Namespace, cfg) -> int:
    import json as _json

    from abpo.arms.cycle import bootstrap_arms, report_to_date

    t0 = time.time()
    log = StepLog()
    from abpo.months import month_range

    months = month_range(cfg.sim.start_month, args.months)
    root = cfg.paths.resolve("root")
    print(f"abpo demo: config {cfg.name}, months {months[0]}..{months[-1]}, state under {root}", flush=True)

    log.run("prepare", prepare_data, cfg)
    arms = log.run("bootstrap", bootstrap_arms, cfg)
    env = airflow_env(cfg, args.config)
    log.run("airflow_db", lambda: {"rc": _run_airflow(["db", "migrate"], env, root / "airflow" / "db-migrate.log"),
                                   "airflow_home": env["AIRFLOW_HOME"]})
    for m in months:
        logical = m.next().bounds()[0].isoformat()  # the run of 2026-02-01T00:00:00+00:00 processes 2026-01
        conf = {"month": m, "simulate": True, "overrides": list(args.overrides)}
        step_log = root / "airflow" / f"dags-test-{m}.log"

        def _month(m=m, logical=logical, conf=conf, step_log=step_log) -> dict[str, Any]:
            rc = _run_airflow(["dags", "test", "abpo_monthly", logical, "-c", _json.dumps(conf)], env, step_log)
            if rc != 0:
                raise RuntimeError(f"airflow dags test abpo_monthly for {m} failed (exit {rc}); log: {step_log}")
            return {"month": m, "log": step_log}

        log.run(f"month {m}", _month)

    final = report_to_date(cfg, months[-1], echo=lambda *_: None)
    md = Path(final["markdown"]).read_text()
    summary = md.split("## Summary", 1)[-1].split("\n## ", 1)[0].strip()
    out = root / "demo_summary.json"
    out.write_text(_json.dumps({"steps": log.steps, "arms": arms, "report": final}, indent=1, default=str))
    wall = time.time() - t0
    print(f"\nabpo demo: {len(months)} months through abpo_monthly in {wall / 60:.1f} min wall time")
    print(f"\nFinal A/B report ({final['months'][0]}..{final['months'][-1]}), summary:\n{summary}\n")
    print(f"  HTML report    {final['html']}")
    print(f"  Airflow UI     AIRFLOW_HOME={env['AIRFLOW_HOME']} .venv/bin/airflow standalone  -> http://localhost:8080 "
          "(runs of abpo_monthly; the A/B reports under /abpo/reports/)")
    print(f"  MLflow UI      .venv/bin/mlflow ui --backend-store-uri {cfg.paths.tracking_uri()}  -> http://localhost:5000 "
          "(models abpo-arm-*: champion / challenger, lineage tags)")
    print(f"  warehouse      {cfg.paths.resolve('warehouse')}")
    print(f"  step log       {out}")
    return 0
