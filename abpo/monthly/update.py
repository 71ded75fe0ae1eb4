"""Step ``update`` (Airflow task ``<arm>.update``, one per LLM arm): the arm's variant (abpo: F, grpo: B), started
from the arm's *current champion*, on the logs of month m (plus ``arms.replay_months`` earlier months), read from
the warehouse strata; the checkpoint is logged into the update's MLflow run. Whose logs: ``arms.update_logs``:
``all`` (default) = every served arm's clean impressions, each row with the e0 its arm logged, so the SNIPS weight
w = e_old/e0 is a real importance weight (rows whose e0 cannot be trusted are refused, abpo.train.update.
refuse_untrusted_rows); ``own`` = only the arm's own rows (logged by the champion it starts from: w = 1). Every
update logs the share of its rows by logging arm and, with ``all``, the quantiles and ESS of w at the first step
(the champion scores the rows before training; abpo.algo.snips.weight_summary): on its log line and its MLflow run
(params ``logged_by.<arm>``, metrics ``first_step_w/*``, tag ``abpo.update_logs``). Too few rows of a stratum raise
NotEnoughFeedback: the arm keeps its champion this month (the DAG marks the arm's steps skipped). With
``arms.gate_users = warehouse`` the rows of the gate's held-out users are left out (counted in the run's tags
abpo.gate_holdout_*): the gate scores users no update trained on.

``update.processes`` N > 1: the update itself runs as N data-parallel processes (``torchrun --nproc_per_node N -m
abpo.monthly.update DIR``, :func:`launch_refresh`): the task writes its inputs (the config, the run, the strata as
Parquet) under DIR, the processes train (abpo.train.distributed: rank 0 logs the one MLflow run and writes
update.json) and the task reads the result back from update.json, so the Airflow task's own process never holds the
model being trained (docs/distributed.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from abpo import registry
from abpo.arms import versions as arm_versions
from abpo.arms.llm import LLMArm
from abpo.arms.names import LLM, LLM_ARMS, arm_class, entry
from abpo.monthly.common import (
    NotEnoughFeedback,
    StepResult,
    champion_at_month_start,
    completed_step,
    dataset_and_splits,
    reuse,
    start_run,
    task_key,
)
from abpo.months import Month
from abpo.train.dataset import subsample_strata
from abpo.train.runs import UpdateInputMissing, read_update_json
from abpo.train.strata import check_update_logs, read_update_strata, refuse_untrusted_rows

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class UpdateResult(StepResult):
    arm: str
    month: str
    run_id: str  # the update's MLflow run, which holds the checkpoint
    model_uri: str
    parent_version: str  # the champion it started from
    months: list[str]  # every month trained on, the parent's included
    data_hash: str
    rows: int
    steps: int
    variant: str
    held_out_rows: int = 0  # the arm's rows of the gate's held-out users left out (arms.gate_users = warehouse)
    update_logs: str = "own"  # arms.update_logs: whose rows it trained on
    logged_by: dict[str, float] = dataclasses.field(default_factory=dict)  # share of the rows by logging arm
    first_step_w: dict[str, float] = dataclasses.field(default_factory=dict)  # weight_summary of w = e_old/e0 (all)


def training_months(cfg: Config, month: Month) -> list[str]:
    """The month and ``arms.replay_months`` months before it (those present in the warehouse)."""
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg, read_only=True) as wh:
        have = set(wh.months())
    want = [str(Month(month).plus(-k)) for k in range(cfg.arms.replay_months, -1, -1)]
    return [x for x in want if x in have or x == month]


def arm_strata(cfg: Config, arm: str, months: list[str]):
    """(positive, no-response, held_out): the rows arm ``arm`` updates from in ``months``: its own
    (``arms.update_logs = own``) or every served arm's (``all``), from the warehouse's strata, without the gate's
    held-out users when the gate reads them (``arms.gate_ope_rows = heldout`` or ``arms.gate_users = warehouse``:
    abpo.train.strata.read_update_strata), and what was left out (a HeldOut; None when nothing is). Rows whose e0 cannot be trusted, or
    of an arm not in arms.names, raise UntrustedLogRows (abpo.train.strata.refuse_untrusted_rows)."""
    from abpo.warehouse import open_warehouse

    own = check_update_logs(cfg.arms.update_logs) == "own"
    path = cfg.paths.resolve("warehouse")
    if not path.exists():
        raise UpdateInputMissing(f"{path}: no warehouse yet; ingest month {months[-1]} first")
    with open_warehouse(cfg, read_only=True) as wh:  # a reader: never holds the write lock
        positive, no_response, held = read_update_strata(
            cfg,
            wh,
            months,
            arm if own else "",
            gate_users=cfg.arms.gate_users,
            gate_holdout_fraction=cfg.arms.gate_holdout_fraction,
            gate_ope_rows=cfg.arms.gate_ope_rows,
        )
    if positive.num_rows + no_response.num_rows == 0:
        why = f" ({held.rows} rows of the gate's held-out users left out)" if held else ""
        whose = f"arm {arm!r}" if own else "any arm (arms.update_logs=all)"
        raise NoArmRows(f"{path}: no impressions of {whose} in months {months}{why}")
    if not own:
        refuse_untrusted_rows(
            (positive, no_response), arms=cfg.arms.names, min_propensity=cfg.data.min_propensity, updating=arm
        )
    return positive, no_response, held


class NoArmRows(NotEnoughFeedback):
    """The warehouse holds no rows the arm's update could train on in its months (the arm served nothing, or every
    row was of the gate's held-out users): the update is skipped with this reason, never a failed month."""


def skip_update(cfg: Config, arm: str, month, reason: str) -> NoReturn:
    """Raise NotEnoughFeedback(``reason``) after recording the skip: an MLflow run ``update-<arm>-<month>-skipped``
    (experiment abpo-arms, tags abpo.arm, abpo.month, abpo.skipped = the reason), once per month and reason, so the
    month's record says why the arm kept its champion; the orchestrator marks the arm's steps skipped."""

    key = task_key(cfg, "update-skipped", arm, month, hashlib.sha256(reason.encode()).hexdigest()[:12])
    if reuse(cfg, arm_versions.EXPERIMENT, key) is None:
        with start_run(
            cfg,
            f"update-{arm}-{month}-skipped",
            {"abpo.arm": arm, "abpo.month": str(month), "abpo.skipped": reason[:4900], registry.TASK_KEY_TAG: key},
        ) as run:
            pass
        registry.record_task_result(run.info.run_id, {"arm": arm, "month": str(month), "skipped": reason})
    log.warning(f"update {arm}: skipped: {reason}")
    raise NotEnoughFeedback(reason)


def first_step_weights(cfg: Config, arm: str, parent_dir, positive, no_response) -> dict[str, float]:
    """abpo.algo.snips.weight_summary of the SNIPS weights w_i = e_old(a_i|q_i) / e0_i (docs/ABPO_SPEC.md step 3)
    at the update's first step, where pi_old is the champion it starts from: the champion (``parent_dir``) scores
    every row the update will train on (the same seeded subsample as abpo.train.dataset.subsample_strata with
    the arm's rows cap, ``arms.update_rows``) over its candidates with the serving scorer (abpo.arms.llm.LLMArm)."""
    import torch

    from abpo.algo.snips import weight_summary

    n = cfg.arms.update_rows(arm, cfg.update.max_examples)
    pos, neg, _ = subsample_strata(positive, no_response, n, cfg.seed)
    ds, _ = dataset_and_splits(cfg)
    champion = LLMArm.from_dir(arm, parent_dir, cfg, ds, "champion")
    w = []
    for t in (pos, neg):
        cols = t.select(["user_id", "history", "candidates", "item_id", "propensity"]).to_pydict()
        requests = list(zip(cols["user_id"], cols["history"], cols["candidates"], strict=True))
        for (_, _, cands), p, item, e0 in zip(
            requests, champion.propensities(requests), cols["item_id"], cols["propensity"], strict=True
        ):
            w.append(float(p[list(cands).index(item)]) / float(e0))
    return weight_summary(torch.tensor(w, dtype=torch.float64))


def registered_update(
    cfg: Config, arm: str, month: str, data_hash: str, parent_version: str, key: str
) -> UpdateResult | None:
    """The update of ``arm``'s ``month`` that a registered version already holds, found by its lineage tags (source
    update, the month, the champion it started from, the rows' hash and the config's hash), or None.
    Its task key finds a completed update first; this finds one whose run the key no longer finds (a state moved and
    relocated from a directory an older key hashed, a damaged or missing task record), so a month whose challenger was
    registered reuses it instead of training and registering a second version of the same month. The run is recorded
    again under ``key`` (abpo.registry.adopt_task_run), so the next lookup finds it by key."""
    name = arm_versions.model_name(arm, cfg)
    want = {
        "source": "update",
        "month": month,
        "parent_version": parent_version,
        "data_hash": data_hash,
        "config_hash": arm_versions.config_hash(cfg),
    }
    for mv in registry.tagged_versions(cfg, name, want):
        if not mv.run_id:
            continue
        out = _update_of_run(arm, mv)
        registry.adopt_task_run(mv.run_id, key, out.to_json())
        log.info(
            f"update {arm}: month {month}'s update from champion v{parent_version} is registered as {name} "
            f"v{mv.version} (run {mv.run_id}), though no completed run has its task key; it is reused, nothing trained"
        )
        return out
    return None


def _update_of_run(arm: str, mv) -> UpdateResult:
    """The UpdateResult of registered version ``mv``'s update run: the result it recorded when that is readable,
    else rebuilt from the version's lineage tags and the run's tags, params and metrics (what update() logged)."""
    run = registry.get_run(mv.run_id)
    try:
        kept = registry.task_result(run)
    except Exception as e:  # noqa: BLE001 - a record lost or damaged: rebuilt from what the run and version hold
        log.warning(f"update {arm}: run {mv.run_id}: its task record cannot be read ({type(e).__name__}); rebuilt")
        kept = None
    if isinstance(kept, dict) and kept.get("run_id") == mv.run_id and kept.get("model_uri"):
        return UpdateResult.from_json(kept)
    tags, data = dict(mv.tags or {}), run.data
    return UpdateResult(
        arm=arm,
        month=tags["month"],
        run_id=mv.run_id,
        model_uri=str(mv.source),
        parent_version=tags["parent_version"],
        months=[m for m in tags.get("months", "").split(",") if m],
        data_hash=tags["data_hash"],
        rows=int(tags.get("rows") or 0),
        steps=int(tags.get("steps") or 0),
        variant=tags.get("variant", ""),
        held_out_rows=int(data.tags.get("abpo.gate_holdout_rows") or 0),
        update_logs=data.tags.get("abpo.update_logs", "own"),
        logged_by={
            k.removeprefix("logged_by."): float(v) for k, v in data.params.items() if k.startswith("logged_by.")
        },
        first_step_w={
            k.removeprefix("first_step_w/"): float(v) for k, v in data.metrics.items() if k.startswith("first_step_w/")
        },
    )


def _check_llm_arm(cfg: Config, arm: str) -> None:
    """Refuse an arm that has no LLM update, and a per-arm update size naming one."""
    if entry(arm).kind != LLM:
        raise ValueError(f"update: {arm!r} is a {entry(arm).kind} arm; rule: one of {list(LLM_ARMS)}")
    not_llm = sorted(a for a in cfg.arms.update_max_examples_by_arm if entry(a).kind != LLM)
    if not_llm:
        raise ValueError(
            f"config arms.update_max_examples_by_arm names {not_llm}, not LLM arms; rule: only an LLM arm "
            f"({list(LLM_ARMS)}) has an update to size"
        )


def _update_line(
    arm: str, parent: str | int, pos, neg, months: list[str], mode: str, shares: dict, weights: dict
) -> str:
    """The update's log line: parent, rows per stratum, whose rows, and the first step's weights when measured."""
    w_text = (
        (
            f"; first-step w = e_old/e0 over {weights['rows']} rows: p50 {weights['p50']:.3g} p90 "
            f"{weights['p90']:.3g} p99 {weights['p99']:.3g} max {weights['max']:.3g}, ESS {weights['ess']:.1f} "
            f"({weights['ess_share']:.1%})"
        )
        if weights
        else ""
    )
    return (
        f"update {arm} ({entry(arm).refreshed_by}) from champion v{parent} on {pos.num_rows} positive + "
        f"{neg.num_rows} no-response rows of {months} (arms.update_logs={mode}; logged by "
        + ", ".join(f"{a} {v:.1%}" for a, v in shares.items())
        + f"){w_text}"
    )


def update(cfg: Config, arm: str, month: Month) -> UpdateResult:
    """The step for one LLM arm (see the module docstring). Returns the run and lineage facts."""
    _check_llm_arm(cfg, arm)
    month = Month(month)
    # the champion of the month's start (recorded once by its bootstrap step), not the alias as it is now: a rerun of
    # a completed month, whose own promotion moved the alias, finds its completed update under the same key
    champ = champion_at_month_start(cfg, arm, str(month))
    if champ is None:
        raise LookupError(f"{arm_versions.model_name(arm, cfg)}: no champion; bootstrap the arms first")
    months = training_months(cfg, month)
    try:
        pos, neg, held = arm_strata(cfg, arm, months)
    except NoArmRows as e:  # an arm that served nothing this month: skipped with its reason, the month goes on
        skip_update(
            cfg,
            arm,
            month,
            f"{e}; rule: an arm with no rows skips its update. The arm keeps champion v{champ.version} this month.",
        )
    need = max(cfg.arms.min_rows_per_stratum, 1)
    if pos.num_rows < need or neg.num_rows < need:
        skip_update(
            cfg,
            arm,
            month,
            f"arm {arm}, months {months}: {pos.num_rows} positive and {neg.num_rows} no-response rows; rule: "
            f"at least arms.min_rows_per_stratum = {need} of each (every SNIPS mini-batch holds both strata). "
            f"The arm keeps champion v{champ.version} this month.",
        )
    data_hash = arm_versions.table_hash(pos, neg)
    key, done = completed_step(
        cfg,
        "update",
        arm,
        month,
        data_hash,
        f"parent-v{champ.version}",
        experiment=cfg.update.mlflow_experiment,
        result=UpdateResult,
    )
    if done is not None:
        return done
    found = registered_update(cfg, arm, str(month), data_hash, str(champ.version), key)
    if found is not None:
        return found
    parent_dir = arm_versions.local_dir(cfg, arm, champ.version)
    from abpo.train.strata import logged_by

    mode = cfg.arms.update_logs
    shares = logged_by((pos, neg))
    weights = first_step_weights(cfg, arm, parent_dir, pos, neg) if mode == "all" else {}
    log.info(_update_line(arm, champ.version, pos, neg, months, mode, shares, weights))
    tags = {registry.TASK_KEY_TAG: key, "abpo.update_logs": mode}
    if held is not None:  # arms.gate_users = warehouse: what D_bandit left out, on the update's run
        tags.update(
            {
                "abpo.gate_users": "warehouse",
                "abpo.gate_holdout_users": str(held.users),
                "abpo.gate_holdout_rows": str(held.rows),
            }
        )
    if cfg.update.processes > 1:
        res = launch_refresh(
            cfg, arm, month=month, parent_dir=parent_dir, months=months, strata=(pos, neg), run_tags=tags
        )
    else:
        res = arm_class(arm).refresh(
            arm, cfg, month=month, parent_dir=parent_dir, months=months, strata=(pos, neg), run_tags=tags
        )
    with registry.resume_run(cfg, res.mlflow_run_id):
        import pyarrow as pa

        uri = arm_versions.log_arm_model(cfg, arm, res.model_dir)
        # the months it trained on, as MLflow dataset inputs with a digest each (the lineage tag data_hash covers all)
        registry.log_training_months(
            pa.concat_tables([pos, neg]),
            name_prefix=f"{arm}-impressions" if mode == "own" else f"{arm}-all-arms-impressions",
            source=cfg.paths.resolve("warehouse"),
        )
        # whose rows, and how far from 1 the first step's SNIPS weights are (the log line's numbers)
        registry.log_params({f"logged_by.{a}": round(v, 6) for a, v in shares.items()})
        if weights:
            registry.log_metrics({f"first_step_w/{k}": float(v) for k, v in weights.items()})
    parent_months = [m for m in (champ.tags or {}).get("months", "").split(",") if m]
    out = UpdateResult(
        arm=arm,
        month=str(month),
        run_id=res.mlflow_run_id,
        model_uri=uri,
        parent_version=str(champ.version),
        months=sorted(set(parent_months) | set(months)),
        data_hash=data_hash,
        rows=pos.num_rows + neg.num_rows,
        steps=res.global_step,
        variant=res.variant,
        held_out_rows=held.rows if held is not None else 0,
        update_logs=mode,
        logged_by=shares,
        first_step_w=weights,
    )
    registry.record_task_result(res.mlflow_run_id, out.to_json())
    return out


# ------------------------------------------------------------------------------------- several processes

LAUNCH_DIR = "launch"  # under the update's output directory: the inputs of a multi-process update


def launch_refresh(cfg: Config, arm: str, *, month: Month, parent_dir: Path, months: list[str], strata, run_tags):
    """The arm's refresh (abpo.arms: ``arm_class(arm).refresh``) as ``update.processes`` data-parallel processes:
    its inputs written under ``<paths.models>/arms/<arm>/<month>/launch/`` (config.yaml, run.json, the strata as
    positive.parquet / no_response.parquet), ``torchrun --standalone --nproc_per_node N -m abpo.monthly.update DIR``
    run to its end, and the result read back from the update.json rank 0 wrote (abpo.train.runs.read_update_json).
    A failed launch raises RuntimeError naming the command, its exit status and the tail of its output."""
    import pyarrow.parquet as pq
    import yaml

    n = int(cfg.update.processes)
    out = cfg.paths.resolve("models") / "arms" / arm / str(month)
    launch = out / LAUNCH_DIR
    launch.mkdir(parents=True, exist_ok=True)
    (out / "update.json").unlink(missing_ok=True)  # the result read back is this launch's, never an older one
    (launch / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (launch / "run.json").write_text(
        json.dumps(
            {
                "arm": arm,
                "month": str(month),
                "parent_dir": str(parent_dir),
                "months": list(months),
                "run_tags": dict(run_tags),
            },
            indent=1,
        )
    )
    pq.write_table(strata[0], launch / "positive.parquet")
    pq.write_table(strata[1], launch / "no_response.parquet")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "-m",
        "abpo.monthly.update",
        str(launch),
    ]
    log.info(f"update {arm}: {n} processes: {' '.join(cmd)}")
    # the processes read the launch's config.yaml; the environment's ABPO_STATE / ABPO_TRACKING_URI would override
    # its paths (abpo.config.ENV_OVERRIDES), so they are set to this config's own: the update lands where it is read
    env = {**os.environ, "ABPO_STATE": str(cfg.paths.resolve("root")), "ABPO_TRACKING_URI": cfg.paths.tracking_uri()}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not (out / "update.json").exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(
            f"update {arm}, month {month}: `{' '.join(cmd)}` exited {proc.returncode}"
            f"{'' if (out / 'update.json').exists() else ' without writing update.json'}:\n{tail}"
        )
    return read_update_json(out / "update.json")


def launched_refresh(launch: Path):
    """One process of :func:`launch_refresh`: the config and inputs from ``launch``, the arm's refresh."""
    import pyarrow.parquet as pq

    from abpo.config import load_config

    cfg = load_config(launch / "config.yaml")
    run = json.loads((launch / "run.json").read_text())
    strata = (pq.read_table(launch / "positive.parquet"), pq.read_table(launch / "no_response.parquet"))
    return arm_class(run["arm"]).refresh(
        run["arm"],
        cfg,
        month=Month(run["month"]),
        parent_dir=Path(run["parent_dir"]),
        months=run["months"],
        strata=strata,
        run_tags=run["run_tags"],
    )


if __name__ == "__main__":  # torchrun -m abpo.monthly.update DIR (launch_refresh)
    from abpo.logs import task_logging

    task_logging("update")
    launched_refresh(Path(sys.argv[1]))
