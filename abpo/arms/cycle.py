"""The continual monthly cycle of the four arms, as plain steps an orchestrator wires (dags/abpo_monthly.py):

    bootstrap     pi_init (SFT, once) -> version 1 of each LLM arm, champion; the ranker arms fitted on the
                  interactions before the first month, champion
    serve         each arm's champion serves month m (abpo.sim: simulated traffic, landed as Parquet)
    ingest        (abpo.pipeline.ingest_and_validate) warehouse partition + Great Expectations
    update        each LLM arm: its variant (abpo: F, grpo: B) from its *current champion* on *its own* month-m
                  logs (plus ``arms.replay_months`` earlier months) -> logged in its MLflow run
    register      the update as a version of the arm's model, alias challenger, lineage tags (abpo.arms.registry)
    gate          challenger against the arm's champion: offline HR@5 on the same held-out users (>= champion's -
                  ``arms.gate_margin``) and the off-policy SNIPS CTR on the arm's month logs (bootstrap lower bound
                  of the difference >= -``arms.gate_ope_margin``); every number printed and logged to MLflow
    promote       champion moves to the challenger only when the gate passed; otherwise it stays where it was
    refit         popularity and ml_retrain refitted on everything seen through month m, registered, champion
    report        the A/B report over every month to date, all arms, with the sample-ratio check; marks the
                  month complete (a month whose predecessor was ingested but never completed refuses to start)

Steps take the config and plain values (month, arm, version numbers) and return plain dicts, so tasks pass
registry versions, never local paths.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from abpo import registry as core_registry
from abpo.arms import registry as arm_registry
from abpo.arms.names import LLM, LLM_ARMS, RANKER, RANKER_ARMS, arm_class, check_arm, entry
from abpo.months import Month

CHAMPION, CHALLENGER = core_registry.CHAMPION, core_registry.CHALLENGER


class NotEnoughFeedback(RuntimeError):
    """An LLM arm's month has too few logged rows of a stratum to update from: the arm keeps its champion this
    month (the orchestrator records the update as skipped, not failed)."""


def arms_of(cfg) -> list[str]:
    return [check_arm(a) for a in cfg.arms.names]


@functools.lru_cache(maxsize=4)
def _data(data_key: str, cfg_json: str):  # data_key: the hash of cfg_json, the cache key
    from abpo.data.config import DataConfig
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    dcfg = DataConfig(**json.loads(cfg_json))
    ds = load_dataset(dcfg)
    splits, _ = split_users(ds, dcfg)
    return ds, splits


def dataset_and_splits(cfg):
    """(dataset, user splits) of the config's data section, cached per process."""
    js = json.dumps(dataclasses.asdict(cfg.data), sort_keys=True)
    return _data(hashlib.sha256(js.encode()).hexdigest(), js)


def _start_run(cfg, run_name: str, tags: dict[str, Any]):
    return core_registry.start_run(cfg, arm_registry.EXPERIMENT, run_name, tags=tags)


def task_key(cfg, *parts: Any) -> str:
    """What a task does and on which inputs, plus the config's hash: the key under which its completed MLflow run
    is found again when the task is retried or its month re-run (abpo.registry.completed_task_run)."""
    return ":".join([*(str(p) for p in parts), arm_registry.config_hash(cfg)])


def _reuse(cfg, experiment: str, key: str, echo) -> dict[str, Any] | None:
    """The recorded result of the completed run of task ``key``, or None (unfinished attempts marked KILLED)."""
    prev = core_registry.completed_task_run(cfg, experiment, key)
    if prev is None:
        return None
    echo(f"  {key.rsplit(':', 1)[0]}: completed before in MLflow run {prev.info.run_id}; its result is reused")
    return core_registry.task_result(prev)


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_arms(cfg, echo=print) -> dict[str, Any]:
    """Every arm gets a champion if it has none: LLM arms start from pi_init (trained and registered first if
    needed), ranker arms are fitted on the interactions before ``sim.start_month``. Arms that already have a
    champion are left as they are (a rerun changes nothing)."""
    from abpo.pipeline import ensure_pi_init

    out: dict[str, Any] = {}
    init = None
    init_metrics: dict[str, float] | None = None
    for arm in arms_of(cfg):
        mv = arm_registry.get_version(cfg, arm, CHAMPION)
        if mv is not None:
            out[arm] = {"version": str(mv.version), "bootstrapped": False}
            continue
        if entry(arm).kind == RANKER:
            res = refit_ranker_arm(cfg, arm, None, echo=echo)
            out[arm] = {"version": res["version"], "bootstrapped": True}
            continue
        if init is None:
            init = ensure_pi_init(cfg)
        tags = arm_registry.lineage_tags(cfg, kind="llm", source="pi_init", parent_version=None, months=[],
                                         data_hash="", variant=entry(arm).refreshed_by,
                                         pi_init_version=f"{core_registry.MODEL_NAME} v{init['model_version']}")
        key = task_key(cfg, "bootstrap", arm, f"pi_init-v{init['model_version']}")
        done = _reuse(cfg, arm_registry.EXPERIMENT, key, echo)
        if done is not None:  # registered before, its champion alias since removed: the same version again
            mv = arm_registry.register_version(cfg, arm, done["model_uri"], done["run_id"], tags, alias=CHAMPION)
        else:
            with _start_run(cfg, f"bootstrap-{arm}", {"abpo.arm": arm, core_registry.TASK_KEY_TAG: key}) as run:
                uri = arm_registry.log_arm_model(cfg, arm, init["model_dir"])
            mv = arm_registry.register_version(cfg, arm, uri, run.info.run_id, tags, alias=CHAMPION)
            core_registry.record_task_result(run.info.run_id, {"model_uri": uri, "run_id": run.info.run_id,
                                                               "version": str(mv.version)})
        echo(f"bootstrap {arm}: {arm_registry.model_name(arm)} v{mv.version} (pi_init) is champion")
        # every LLM arm starts from the same checkpoint: its gate metrics are computed (or taken from pi_init's
        # SFT evaluation, which scores the same seeded users when arms.gate_max_users is 0) once, not per arm
        if init_metrics is None:
            fresh = init.get("metrics") if not cfg.arms.gate_max_users else None
            init_metrics = record_offline_metrics(cfg, arm, str(mv.version), fresh) if fresh else \
                offline_metrics(cfg, arm, str(mv.version), echo=echo)
        else:
            record_offline_metrics(cfg, arm, str(mv.version), init_metrics)
        out[arm] = {"version": str(mv.version), "bootstrapped": True}
    return out


# ------------------------------------------------------------------------------------------------- serve


def serve_month(cfg, month: str, echo=print) -> dict[str, Any]:
    """Month ``month``'s traffic served by every arm's champion (abpo.sim.simulate_month), landed as Parquet."""
    from abpo.sim.simulator import simulate_month

    ds, splits = dataset_and_splits(cfg)
    arms = {a: arm_registry.load_arm(cfg, a, ds) for a in arms_of(cfg)}
    res = simulate_month(cfg, month, arms, dataset=ds, splits=splits, echo=echo)
    for a, v in res.per_arm.items():
        echo(f"  {a:<11} {v['impressions']:>6} impressions {v['clicks']:>5} clicks  CTR {v['ctr']:.4f}")
    return {"month": month, "path": str(res.path), "seconds": res.seconds, "per_arm": res.per_arm}


# ------------------------------------------------------------------------------------------ LLM arm update


def training_months(cfg, month: str) -> list[str]:
    """The month and ``arms.replay_months`` months before it (those present in the warehouse)."""
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg, read_only=True) as wh:
        have = set(wh.months())
    want = [str(Month(month).plus(-k)) for k in range(cfg.arms.replay_months, -1, -1)]
    return [x for x in want if x in have or x == month]


def update_llm_arm(cfg, arm: str, month: str, echo=print) -> dict[str, Any]:
    """The arm's variant, started from the arm's current champion, on the arm's own logs of ``month`` (and the
    replay window); the checkpoint is logged into the update's MLflow run. Returns the run and lineage facts."""
    import mlflow

    from abpo.train.update import warehouse_strata

    if entry(arm).kind != LLM:
        raise ValueError(f"update_llm_arm: {arm!r} is a ranker arm; rule: one of {list(LLM_ARMS)}")
    champ = arm_registry.get_version(cfg, arm, CHAMPION)
    if champ is None:
        raise LookupError(f"{arm_registry.model_name(arm)}: no champion; bootstrap the arms first")
    parent_dir = arm_registry.local_dir(cfg, arm, champ.version)
    months = training_months(cfg, month)
    c = dataclasses.replace(cfg, update=dataclasses.replace(cfg.update, arm=arm, months=months))
    pos, neg, months = warehouse_strata(c)
    need = max(cfg.arms.min_rows_per_stratum, 1)
    if pos.num_rows < need or neg.num_rows < need:
        raise NotEnoughFeedback(
            f"arm {arm}, months {months}: {pos.num_rows} positive and {neg.num_rows} no-response rows; rule: at "
            f"least arms.min_rows_per_stratum = {need} of each (every SNIPS mini-batch holds both strata). The arm "
            f"keeps champion v{champ.version} this month.")
    data_hash = arm_registry.table_hash(pos, neg)
    key = task_key(cfg, "update", arm, month, data_hash, f"parent-v{champ.version}")
    done = _reuse(cfg, cfg.update.mlflow_experiment, key, echo)
    if done is not None:
        return done
    echo(f"update {arm} ({entry(arm).refreshed_by}) from champion v{champ.version} on {pos.num_rows} positive + {neg.num_rows} "
         f"no-response rows of {months}")
    res = arm_class(arm).refresh(arm, cfg, month=month, parent_dir=parent_dir, strata=(pos, neg, months),
                                 run_tags={core_registry.TASK_KEY_TAG: key})
    with mlflow.start_run(run_id=res.mlflow_run_id):
        uri = arm_registry.log_arm_model(cfg, arm, res.model_dir)
    parent_months = [m for m in (champ.tags or {}).get("months", "").split(",") if m]
    out = {"arm": arm, "month": month, "run_id": res.mlflow_run_id, "model_uri": uri,
           "parent_version": str(champ.version), "months": sorted(set(parent_months) | set(months)),
           "data_hash": data_hash, "rows": pos.num_rows + neg.num_rows, "steps": res.global_step,
           "variant": res.variant}
    core_registry.record_task_result(res.mlflow_run_id, out)
    return out


def register_update(cfg, arm: str, updated: dict[str, Any], echo=print) -> dict[str, Any]:
    """The update as a new version of the arm's model, alias challenger (a retry of the same run reuses its
    version)."""
    tags = arm_registry.lineage_tags(cfg, kind="llm", source="update", parent_version=updated["parent_version"],
                                     months=updated["months"], data_hash=updated["data_hash"],
                                     variant=updated["variant"], month=updated["month"], rows=updated["rows"],
                                     steps=updated["steps"])
    mv = arm_registry.register_version(cfg, arm, updated["model_uri"], updated["run_id"], tags, alias=CHALLENGER)
    echo(f"register {arm}: {arm_registry.model_name(arm)} v{mv.version} (parent v{updated['parent_version']}) "
         f"is challenger")
    return {"arm": arm, "version": str(mv.version), "parent_version": updated["parent_version"]}


# ---------------------------------------------------------------------------------------------------- gate


def gate_examples(cfg):
    """The held-out users every gate scores (seeded): x_{T+N} targets with evaluation candidates."""
    from abpo.data.candidates import build_eval_examples, training_popularity
    from abpo.policy.sft import seeded_subsample

    ds, splits = dataset_and_splits(cfg)
    n = cfg.arms.gate_max_users or cfg.sft.eval_max_users
    examples = seeded_subsample(build_eval_examples(splits, ds, cfg.data), n, cfg.seed)
    key = hashlib.sha256(json.dumps([ds.name, cfg.data.seed, cfg.data.eval_candidates, cfg.seed,
                                     cfg.data.tie_seed, cfg.data.eval_hard_negative_fraction,
                                     [e.request_id for e in examples],
                                     [e.candidates for e in examples]]).encode()).hexdigest()[:12]
    return examples, training_popularity(splits, ds), key


def _metric_tag(metric: str) -> str:
    return "gate.m." + metric.replace("@", "_at_")  # MLflow tag keys allow no '@'


def _metric_name(tag: str) -> str:
    return tag[len("gate.m."):].replace("_at_", "@")


def offline_metrics(cfg, arm: str, version: str, echo=print) -> dict[str, float]:
    """The version's offline metrics on the gate's users, computed once per (version, user set) and kept as
    version tags ``gate.m.<metric>`` (versions are immutable, so a champion is never scored twice)."""
    from abpo.policy.evaluate import evaluate_policy
    from abpo.policy.model import load_policy

    examples, popularity, key = gate_examples(cfg)
    mv = arm_registry.get_version(cfg, arm, version)
    tags = dict(mv.tags or {})
    if tags.get("gate.eval_key") == key:
        return {_metric_name(k): float(v) for k, v in tags.items() if k.startswith("gate.m.")}
    ds, _ = dataset_and_splits(cfg)
    t = time.time()
    path = arm_registry.local_dir(cfg, arm, version)
    model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(path)), cfg.paths, dataset=ds)
    res = evaluate_policy(model, tok, examples, ds.titles(), cfg.policy, popularity=popularity, progress=False)
    metrics = {k: float(v) for k, v in res.metrics.items() if not k.startswith("random_")}
    record_offline_metrics(cfg, arm, version, metrics)
    echo(f"  scored {arm} v{version} on {len(examples)} held-out users in {time.time() - t:.0f}s")
    return metrics


def record_offline_metrics(cfg, arm: str, version: str, metrics: dict[str, float]) -> dict[str, float]:
    """Keep ``metrics`` (on the gate's users) as the version's ``gate.m.*`` tags; returns them without random_*."""
    _, _, key = gate_examples(cfg)
    kept = {k: float(v) for k, v in metrics.items() if not k.startswith("random_")}
    arm_registry.set_tags(cfg, arm, version, {"gate.eval_key": key, **{_metric_tag(k): v for k, v in kept.items()}})
    return kept


def off_policy_gate(cfg, arm: str, version: str, month: str, echo=print) -> dict[str, Any]:
    """The challenger's SNIPS CTR on the arm's own month-``month`` logs against the champion's, with a bootstrap
    interval of the difference and both effective sample sizes (abpo.evaluation.off_policy.compare_snips).
    Rows the champion logged are weighted 1 for it (its propensity is the logged e0); other rows are rescored."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from abpo.evaluation.off_policy import compare_snips
    from abpo.warehouse import open_warehouse

    ds, _ = dataset_and_splits(cfg)
    champ = arm_registry.get_version(cfg, arm, CHAMPION)
    with open_warehouse(cfg, read_only=True) as wh:
        pos, neg = wh.strata([month])
    rows = pa.concat_tables([pos, neg])
    rows = rows.filter(pc.equal(rows.column("arm"), arm))
    if rows.num_rows == 0:
        raise ValueError(f"off-policy gate {arm} v{version}: no logged rows of arm {arm} in {month}")
    reqs = list(zip(rows.column("user_id").to_pylist(), rows.column("history").to_pylist(),
                    rows.column("candidates").to_pylist()))
    items = rows.column("item_id").to_pylist()

    def target(ref: str) -> np.ndarray:
        arm_obj = arm_registry.load_arm(cfg, arm, ds, ref)
        return np.array([float(p[list(c).index(a)]) for p, (_, _, c), a in
                         zip(arm_obj.propensities(reqs), reqs, items, strict=True)])

    e0 = np.asarray(rows.column("propensity").to_pylist(), dtype=np.float64)
    logged_by_champion = set(rows.column("model_version").to_pylist()) == {str(champ.version)}
    e_champ = e0 if logged_by_champion else target(str(champ.version))
    cmp = compare_snips(rows.column("clicked").to_pylist(), e0, target(str(version)), e_champ,
                        n_boot=cfg.arms.gate_ope_bootstrap, seed=cfg.seed)
    return {"n": cmp.n, "challenger_snips": cmp.challenger.snips, "champion_snips": cmp.champion.snips,
            "diff": cmp.diff, "ci_low": cmp.ci_low, "ci_high": cmp.ci_high, "confidence": cmp.confidence,
            "challenger_ess": cmp.challenger.ess, "champion_ess": cmp.champion.ess,
            "challenger_max_weight": cmp.challenger.max_weight}


def ope_verdict(ope: dict[str, Any], margin: float, min_ess: float) -> tuple[bool, str]:
    """The off-policy check of the gate, failing closed: a non-finite estimate (a NaN SNIPS, interval or effective
    sample size: e.g. a logged propensity so small that its weight overflowed) or an effective sample size below
    ``min_ess`` fails, whatever the interval says; otherwise the interval's lower bound must be >= -``margin``."""
    import math

    keys = ("challenger_snips", "champion_snips", "diff", "ci_low", "ci_high", "challenger_ess")
    bad = [k for k in keys if not isinstance(ope.get(k), (int, float)) or not math.isfinite(float(ope[k]))]
    if bad:
        return False, (f"off-policy estimate not finite ({', '.join(f'{k} {ope.get(k)}' for k in bad)}) on "
                       f"{ope.get('n')} rows: fails closed")
    if ope["challenger_ess"] < min_ess:
        return False, (f"off-policy effective sample size {ope['challenger_ess']:.1f} of {ope.get('n')} rows < "
                       f"arms.gate_min_ess {min_ess:g}: fails closed (SNIPS diff {ope['diff']:+.4f})")
    ok = bool(ope["ci_low"] >= -margin)
    return ok, (f"off-policy SNIPS CTR challenger {ope['challenger_snips']:.4f} vs champion "
                f"{ope['champion_snips']:.4f} on {ope['n']} rows: diff {ope['diff']:+.4f}, {ope['confidence']:.0%} CI "
                f"[{ope['ci_low']:+.4f}, {ope['ci_high']:+.4f}] {'>=' if ok else '<'} -margin {margin} (ESS "
                f"{ope['challenger_ess']:.0f})")


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """What :func:`gate_verdict` decided: both halves and the reason printed, logged and tagged."""

    passed: bool
    offline_passed: bool
    ope_passed: bool  # True when the off-policy half did not run
    reason: str


def gate_verdict(*, metric: str, challenger: dict[str, float], champion: dict[str, float], margin: float,
                 challenger_version: str, champion_version: str, ope: dict[str, Any] | None = None,
                 ope_margin: float = 0.0, min_ess: float = 0.0, month: str | None = None) -> GateVerdict:
    """The gate's decision, a pure function of the numbers (no registry, no MLflow). Offline: the challenger's
    ``metric`` at least the champion's minus ``margin``; a non-finite value on either side fails closed. Off-policy
    (when ``ope`` is given): :func:`ope_verdict` with ``ope_margin`` and ``min_ess``. Both must pass."""
    import math

    for side, metrics in (("challenger", challenger), ("champion", champion)):
        if metric not in metrics:
            raise ValueError(f"gate: the {side}'s metrics have no {metric!r} (arms.gate_metric; rule: one of "
                             f"{sorted(metrics)})")
    new, old = float(challenger[metric]), float(champion[metric])
    if math.isfinite(new) and math.isfinite(old) and math.isfinite(margin):
        offline_ok = new >= old - margin
        reasons = [f"offline {metric} challenger v{challenger_version} {new:.4f} {'>=' if offline_ok else '<'} "
                   f"champion v{champion_version} {old:.4f} - margin {margin}"]
    else:
        offline_ok = False
        reasons = [f"offline {metric} not finite (challenger v{challenger_version} {new}, champion "
                   f"v{champion_version} {old}, margin {margin}): fails closed"]
    ope_ok = True
    if ope is not None:
        ope_ok, why = ope_verdict(ope, ope_margin, min_ess)
        reasons.append(f"{why} ({month})" if month else why)
    return GateVerdict(offline_ok and ope_ok, offline_ok, ope_ok, "; ".join(reasons))


def gate_arm(cfg, arm: str, version: str, month: str | None = None, echo=print) -> dict[str, Any]:
    """Challenger ``version`` against the arm's champion. Offline: ``arms.gate_metric`` on the held-out users at
    least the champion's minus ``arms.gate_margin``. Off-policy (when ``month`` is given and
    ``arms.gate_ope_margin`` >= 0): the lower bound of the bootstrap interval of SNIPS CTR (challenger - champion)
    on the arm's month logs at least -``arms.gate_ope_margin``, the estimate finite and its effective sample size at
    least ``arms.gate_min_ess`` (:func:`ope_verdict`: fails closed). Both must pass. Every number is logged to MLflow
    (experiment abpo-arms, run gate-<arm>-v<version>) and kept as version tags; the verdict and its reason are
    printed."""
    champ = arm_registry.get_version(cfg, arm, CHAMPION)
    key = task_key(cfg, "gate", arm, f"v{version}", f"champion-v{champ.version}", month or "offline")
    done = _reuse(cfg, arm_registry.EXPERIMENT, key, echo)
    if done is not None:
        echo(f"gate {arm}: {'PASS' if done['passed'] else 'FAIL'}: {done['reason']}")
        return done
    metric = cfg.arms.gate_metric
    ch = offline_metrics(cfg, arm, str(champ.version), echo=echo)
    new = offline_metrics(cfg, arm, str(version), echo=echo)
    ope = None
    if month is not None and cfg.arms.gate_ope_margin >= 0:
        ope = off_policy_gate(cfg, arm, str(version), month, echo=echo)
    verdict = gate_verdict(metric=metric, challenger=new, champion=ch, margin=cfg.arms.gate_margin,
                           challenger_version=str(version), champion_version=str(champ.version), ope=ope,
                           ope_margin=cfg.arms.gate_ope_margin, min_ess=cfg.arms.gate_min_ess, month=month)
    passed, reason = verdict.passed, verdict.reason
    echo(f"gate {arm}: {'PASS' if passed else 'FAIL'}: {reason}")
    arm_registry.set_tags(cfg, arm, version, {"gate.verdict": "pass" if passed else "fail", "gate.reason": reason[:4900],
                                             "gate.champion_version": champ.version})
    numbers = {f"offline.challenger.{k.replace('@', '_at_')}": v for k, v in new.items()}
    numbers.update({f"offline.champion.{k.replace('@', '_at_')}": v for k, v in ch.items()})
    numbers.update({f"ope.{k}": float(v) for k, v in (ope or {}).items()})
    numbers["passed"] = float(passed)
    with _start_run(cfg, f"gate-{arm}-v{version}", {"abpo.arm": arm, "abpo.month": month or "",
                                                     "abpo.challenger": version,
                                                     "abpo.champion": str(champ.version), "abpo.verdict": reason[:4900],
                                                     core_registry.TASK_KEY_TAG: key}) as run:
        import mlflow

        mlflow.log_metrics({k: float(v) for k, v in numbers.items() if v == v})  # NaN-free
    out = {"arm": arm, "version": str(version), "champion_version": str(champ.version), "passed": passed,
           "reason": reason, "metric": metric, "challenger": new, "champion": ch, "off_policy": ope}
    core_registry.record_task_result(run.info.run_id, json_safe(out))
    return out


def promote_arm(cfg, arm: str, gate: dict[str, Any], echo=print) -> dict[str, Any]:
    """Move the arm's champion to the gated challenger when the gate passed; otherwise leave it where it was."""
    if gate["passed"]:
        arm_registry.promote(cfg, arm, gate["version"], expected_champion=gate["champion_version"],
                             reason=f"gate passed: {gate['reason']}"[:4900])
        echo(f"promote {arm}: champion -> v{gate['version']}")
    else:
        echo(f"promote {arm}: champion stays v{gate['champion_version']} (v{gate['version']} stays challenger)")
    now = arm_registry.get_version(cfg, arm, CHAMPION)
    return {"arm": arm, "champion_version": str(now.version), "promoted": bool(gate["passed"])}


# --------------------------------------------------------------------------------------------- ranker arms


def ranker_training_sequences(cfg, month: str | None) -> tuple[dict[int, list[int]], list[str]]:
    """Interactions and clicks through ``month`` (None: only what precedes ``sim.start_month``), per user,
    chronological; and the months they cover."""
    from abpo.sim.simulator import interactions_to_date
    from abpo.warehouse import open_warehouse

    _, splits = dataset_and_splits(cfg)
    if month is None:
        return interactions_to_date(cfg, splits, cfg.sim.start_month), []
    seqs = interactions_to_date(cfg, splits, str(Month(month).next()))
    with open_warehouse(cfg, read_only=True) as wh:
        clicks = wh.run("clicks_to_date", month=month)
        months = [m for m in wh.months() if m <= month]
    for u, i in zip(clicks.column("user_id").to_pylist(), clicks.column("item_id").to_pylist()):
        seqs.setdefault(int(u), []).append(int(i))
    return seqs, months


def refit_ranker_arm(cfg, arm: str, month: str | None, echo=print) -> dict[str, Any]:
    """Refit a ranker arm on everything seen through ``month`` (None: the bootstrap fit), register it with lineage
    and make it champion (a refit has no gate: it is the arm's definition, retrained)."""
    if entry(arm).kind != RANKER:
        raise ValueError(f"refit_ranker_arm: {arm!r} is an LLM arm; rule: one of {list(RANKER_ARMS)}")
    ds, _ = dataset_and_splits(cfg)
    t = time.time()
    seqs, months = ranker_training_sequences(cfg, month)
    fitted = arm_class(arm).refresh(arm, cfg, sequences=seqs, item_ids=ds.item_ids().tolist())
    out_dir = fitted.save(cfg.paths.resolve("models") / "arms" / arm / (month or "bootstrap"))
    data_hash = hashlib.sha256(json.dumps(sorted(seqs.items())).encode()).hexdigest()[:16]
    key = task_key(cfg, "refit", arm, month or "bootstrap", data_hash)
    done = _reuse(cfg, arm_registry.EXPERIMENT, key, echo)
    if done is not None:
        return done
    parent = arm_registry.get_version(cfg, arm, CHAMPION)
    tags = arm_registry.lineage_tags(cfg, kind="ranker", source="refit" if month else "bootstrap",
                                     parent_version=parent.version if parent else None, months=months,
                                     data_hash=data_hash, variant=arm, interactions=sum(map(len, seqs.values())))
    with _start_run(cfg, f"refit-{arm}-{month or 'bootstrap'}", {"abpo.arm": arm, "abpo.month": month or "",
                                                                 core_registry.TASK_KEY_TAG: key}) as run:
        uri = arm_registry.log_arm_model(cfg, arm, out_dir)
    mv = arm_registry.register_version(cfg, arm, uri, run.info.run_id, tags, alias=None)
    arm_registry.promote(cfg, arm, mv.version, reason=f"refit through {month or 'the start'}")
    echo(f"refit {arm}: {sum(map(len, seqs.values()))} interactions and clicks through {month or 'the start'} in "
         f"{time.time() - t:.1f}s -> {arm_registry.model_name(arm)} v{mv.version}, champion")
    out = {"arm": arm, "version": str(mv.version), "months": months}
    core_registry.record_task_result(run.info.run_id, out)
    return out


# -------------------------------------------------------------------------------------------------- report


class PreviousMonthIncomplete(RuntimeError):
    """Month m-1 was started (ingested) but its cycle never finished: month m must not run on top of it."""


def _done_marker(cfg, month: str) -> Path:
    return cfg.paths.resolve("root") / "cycle" / f"{month}.json"


def mark_month_complete(cfg, month: str, facts: dict[str, Any]) -> Path:
    """Record that ``month``'s cycle finished (written by the report step, the last one)."""
    path = _done_marker(cfg, month)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(facts)))
    tmp.replace(path)
    return path


def require_previous_month(cfg, month: str) -> None:
    """Refuse to start ``month`` when an earlier month was ingested but its cycle did not finish (a failed or
    interrupted run): its arms may be half-updated, so the next month would serve and train on top of that.
    Rerun the failed month first (reruns are idempotent on the data side)."""
    from abpo.warehouse import open_warehouse

    if not cfg.paths.resolve("warehouse").exists():
        return
    with open_warehouse(cfg, read_only=True) as wh:
        earlier = [m for m in wh.months() if m < month]
    unfinished = [m for m in earlier if not _done_marker(cfg, m).exists()]
    if unfinished:
        raise PreviousMonthIncomplete(
            f"month {month}: earlier month(s) {unfinished} were ingested but their cycle never finished (no "
            f"{_done_marker(cfg, unfinished[-1])}); rerun abpo_monthly for {unfinished[-1]} first")


def report_to_date(cfg, month: str, echo=print) -> dict[str, Any]:
    """The A/B report over every warehouse month up to ``month``, every arm (sample-ratio check on the configured
    shares)."""
    from abpo.abtest.report import report_from_warehouse
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg, read_only=True) as wh:
        months = [m for m in wh.months() if m <= month]
    report, files = report_from_warehouse(cfg, months)
    echo(f"report {months[0]}..{months[-1]}: {files.html}")
    out = {"months": months, "html": str(files.html), "markdown": str(files.markdown), "png": str(files.png)}
    mark_month_complete(cfg, month, out)
    return out


# ------------------------------------------------------------------------------------------- a whole month


def run_month(cfg, month: str, *, serve: bool = True, echo=print) -> dict[str, Any]:
    """The whole cycle for ``month`` in one process (what the DAG runs as tasks): serve -> ingest -> per LLM arm
    update/register/gate/promote -> ranker refits -> report."""
    from abpo.pipeline import ingest_and_validate

    require_previous_month(cfg, month)
    out: dict[str, Any] = {"month": month, "bootstrap": bootstrap_arms(cfg, echo=echo)}
    if serve:
        out["serve"] = serve_month(cfg, month, echo=echo)
    out["ingest"] = ingest_and_validate(cfg, month)
    for arm in arms_of(cfg):
        if entry(arm).kind == RANKER:
            continue
        try:
            updated = update_llm_arm(cfg, arm, month, echo=echo)
        except NotEnoughFeedback as e:
            echo(f"update {arm}: skipped: {e}")
            out[arm] = {"skipped": str(e)}
            continue
        reg = register_update(cfg, arm, updated, echo=echo)
        gate = gate_arm(cfg, arm, reg["version"], month, echo=echo)
        out[arm] = {"update": updated, "gate": gate, "promote": promote_arm(cfg, arm, gate, echo=echo)}
    for arm in arms_of(cfg):
        if entry(arm).kind == RANKER:
            out[arm] = refit_ranker_arm(cfg, arm, month, echo=echo)
    out["report"] = report_to_date(cfg, month, echo=echo)
    return out


def json_safe(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): json_safe(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [json_safe(v) for v in d]
    if isinstance(d, Path):
        return str(d)
    return d
