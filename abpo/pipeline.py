"""The monthly pipeline's steps as plain functions, and `abpo demo`: the main job end to end on the
embedded defaults.

    prepare -> pi_init (SFT, registered as champion) -> bandit log landed for the month -> ingest + validate
    -> update (ABPO) -> register (challenger) -> evaluate (the gate) -> promote (champion moves if it passes)

Each step takes the loaded :class:`abpo.config.Config` and returns what it produced, so an orchestrator (an
Airflow DAG, a notebook, this module's `demo`) only wires them. Re-running a month is idempotent on the data
side (the landed part and the warehouse partition are replaced); every model run is a new MLflow run and
registry version, as registries are append-only records.
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
    """Train pi_init by SFT on D_sup and register it (alias champion + pi_init), unless a registered pi_init
    already exists for this state directory and ``fresh`` is not set."""
    from abpo import registry
    from abpo.policy.sft import PI_INIT_ALIAS, train_sft

    registry.configure(cfg)
    existing = registry.get_version(PI_INIT_ALIAS)
    if existing is not None and (pi_init_dir(cfg) / "config.json").exists() and not fresh:
        return {"model_dir": pi_init_dir(cfg), "model_version": existing.version, "reused": True}
    res = train_sft(cfg)
    return {
        "model_dir": res.model_dir,
        "model_version": res.model_version,
        "mlflow_run": res.mlflow_run_id,
        "reused": False,
        **{k: v for k, v in (res.metrics or {}).items() if k.startswith(("HR@", "random_HR@"))},
    }


def land_bandit_log(cfg, month: str) -> dict[str, Any]:
    """D_bandit logged by pi_init for ``month``, landed as Parquet (a rerun replaces the part)."""
    from abpo.policy.bandit import build_bandit_log

    table = build_bandit_log(cfg, month=month, arm=cfg.update.arm)
    clicked = sum(table.column("clicked").to_pylist())
    return {"impressions": table.num_rows, "clicks": clicked, "landing": cfg.paths.resolve("landing")}


def ingest_and_validate(cfg, month: str) -> dict[str, Any]:
    """Replace the month's partition in the warehouse (contract violations quarantined) and run the GX suite."""
    from abpo.validation import validate_month
    from abpo.warehouse import Warehouse

    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        report = wh.ingest_month(cfg.paths.resolve("landing"), month, cfg.data.known_arms)
        summary = validate_month(wh, month, cfg.data.known_arms, out_dir=cfg.paths.resolve("root") / "validation")
    if not summary.success:
        raise RuntimeError(f"month {month}: Great Expectations suite failed, see {summary.path}")
    return {
        "rows_in": report.rows_in,
        "rows_clean": report.rows_clean,
        "quarantined": dict(report.quarantined_by_rule),
        "validation": summary.path,
        "warehouse": cfg.paths.resolve("warehouse"),
    }


def update_policy(cfg):
    """The update of the arm's policy from the warehouse strata (``update.variant``; abpo by default)."""
    from abpo.train.update import run_update

    return run_update(cfg, progress=True)


def register_update(cfg, result, month: str):
    """Log the updated checkpoint into its MLflow run and register it as a new version, alias challenger."""
    import mlflow

    from abpo import registry

    registry.configure(cfg)
    with mlflow.start_run(run_id=result.mlflow_run_id):
        uri = registry.log_model_dir(result.model_dir, policy_cfg=cfg.policy)
    return registry.register(
        uri,
        alias=registry.CHALLENGER,
        tags={"role": "update", "variant": result.variant, "month": month, "run_id": result.mlflow_run_id,
              "init_model": str(result.init_model_dir)},
    )


def evaluate_gate(cfg, challenger_dir: Path, champion_dir: Path, *, metric: str = "HR@5") -> dict[str, Any]:
    """Offline gate: challenger and champion on the same held-out targets (ABPO_SPEC.md Metrics). Passes when
    the challenger is not worse on ``metric``."""
    from abpo.data.candidates import build_eval_examples, training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.evaluate import evaluate_policy
    from abpo.policy.model import load_policy
    from abpo.policy.sft import seeded_subsample

    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    # the same held-out users pi_init was evaluated on after SFT
    examples = seeded_subsample(build_eval_examples(splits, ds, cfg.data), cfg.sft.eval_max_users, cfg.seed)
    popularity = training_popularity(splits, ds)
    out: dict[str, Any] = {}
    for role, path in (("champion", champion_dir), ("challenger", challenger_dir)):
        model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(path)), cfg.paths, dataset=ds)
        res = evaluate_policy(model, tok, examples, ds.titles(), cfg.policy, popularity=popularity,
                              progress=f"evaluate {role}")
        out[role] = {k: v for k, v in res.metrics.items() if not k.startswith("random_")}
        out["random_" + metric] = res.metrics[f"random_{metric}"]
    out["users"] = len(examples)
    out["metric"] = metric
    out["passed"] = out["challenger"][metric] >= out["champion"][metric]
    return out


def promote(cfg, version: str | int) -> None:
    from abpo import registry

    registry.configure(cfg)
    registry.set_alias(registry.CHAMPION, version)


# ------------------------------------------------------------------------------------------------ abpo demo


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="Run the main job end to end on the embedded defaults and say what it produced.",
        description="Run the main job end to end on the embedded defaults (bundled MovieLens, DuckDB, "
        "SQLite-backed MLflow, the tiny CPU model): prepare the data, train and register pi_init, land the "
        "month's bandit log, ingest and validate it, run the ABPO update, register it as challenger, evaluate "
        "it against the champion and promote it if the gate passes. Prints what it produced and where.",
    )
    p.add_argument("--month", default="2024-01", help="Month the bandit log is landed under (default: 2024-01).")
    p.add_argument("--fresh", action="store_true", help="Retrain pi_init even when a registered one exists.")
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace, cfg) -> int:
    from abpo import registry

    log = StepLog()
    month = args.month
    print(f"abpo demo: config {cfg.name}, month {month}, state under {cfg.paths.resolve('root')}", flush=True)

    log.run("prepare", prepare_data, cfg)
    init = log.run("pi_init", ensure_pi_init, cfg, fresh=args.fresh)
    log.run("bandit_log", land_bandit_log, cfg, month)
    log.run("ingest", ingest_and_validate, cfg, month)
    result = log.run("update", update_policy, cfg, describe=lambda r: {
        "variant": r.variant, "steps": r.global_step, "model_dir": r.model_dir, "checkpoint": r.checkpoint_dir,
        "mlflow_run": r.mlflow_run_id})
    mv = log.run("register", register_update, cfg, result, month, describe=lambda v: {
        "model": registry.MODEL_NAME, "version": v.version, "alias": registry.CHALLENGER})
    gate = log.run("evaluate", evaluate_gate, cfg, Path(result.model_dir), Path(init["model_dir"]))

    def _promote() -> dict[str, Any]:
        if gate["passed"]:
            promote(cfg, mv.version)
        return {"promoted": gate["passed"], "champion_version": registry.get_version(registry.CHAMPION).version}

    log.run("promote", _promote)

    out = cfg.paths.resolve("root") / "demo_summary.json"
    out.write_text(json.dumps(log.steps, indent=1, default=str))
    print("\nabpo demo produced:")
    print(f"  warehouse      {cfg.paths.resolve('warehouse')}  (tables impressions, quarantine, ingest_runs)")
    print(f"  landing zone   {cfg.paths.resolve('landing')}/impressions/month={month}/")
    print(f"  pi_init        {init['model_dir']}  ({registry.MODEL_NAME} v{init['model_version']})")
    print(f"  ABPO update    {result.model_dir}  ({registry.MODEL_NAME} v{mv.version}, alias {registry.CHALLENGER})")
    print(f"  gate           {gate['metric']}: challenger {gate['challenger'][gate['metric']]:.4f} vs champion "
          f"{gate['champion'][gate['metric']]:.4f} (random {gate['random_' + gate['metric']]:.4f}) -> "
          f"{'promoted to champion' if gate['passed'] else 'not promoted'}")
    print(f"  MLflow         {cfg.paths.tracking_uri()}  (UI: .venv/bin/mlflow ui --backend-store-uri "
          f"{cfg.paths.tracking_uri()})")
    print(f"  step log       {out}")
    return 0
