"""Step ``bootstrap`` (Airflow task ``bootstrap``): refuse a month whose predecessor was ingested but never
finished, record any champion moved by hand in MLflow since the last recorded move (the promotion history,
abpo.arms.history), then give every arm without a champion its first one: the LLM arms pi_init (trained by SFT and registered
first when there is none), the ranker arms a fit on the interactions before ``sim.start_month``. Arms that have a
champion are left as they are (a rerun changes nothing)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import promotion, versions as arm_versions
from abpo.arms.history import require_champion_or_none_recorded
from abpo.arms.names import RANKER, entry
from abpo.data.holdout import check_gate_users, check_holdout_fraction
from abpo.monthly.common import (
    CHAMPION,
    StepResult,
    arms_of,
    completed_step,
    record_month_start,
    start_run,
    task_key,
)
from abpo.monthly.gate import offline_scores, record_offline_metrics
from abpo.monthly.refit import refit
from abpo.monthly.report import completed_months, require_month_order, require_previous_month
from abpo.monthly.series import check_series
from abpo.months import Month
from abpo.policy.sft import PI_INIT_ALIAS, train_sft

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BootstrapResult(StepResult):
    arms: dict[str, dict[str, Any]]  # arm -> {"version": its champion, "bootstrapped": registered just now}


def pi_init_dir(cfg: Config) -> Path:
    return cfg.paths.resolve("models") / cfg.sft.output


def ensure_pi_init(cfg: Config, *, fresh: bool = False) -> dict[str, Any]:
    """Train pi_init by SFT on D_sup and register it (alias pi_init; champion only when none exists), unless a
    registered pi_init exists and ``fresh`` is not set: then it is reused, downloaded from the registry when the
    local directory is missing (a fresh worker), never retrained behind the registry's back. A registry that cannot
    answer raises (abpo.registry.RegistryUnavailable)."""

    # the SFT runs under a task key (abpo.registry.completed_task_run): an attempt killed mid-SFT (a lost worker, a
    # task the scheduler reset) left its run RUNNING; the next call marks it KILLED, whether it retrains or reuses
    key = task_key(cfg, "sft", "pi_init")
    registry.completed_task_run(cfg, cfg.sft.experiment, key)
    pi_init_name = registry.model_name(cfg)
    existing = registry.get_version(PI_INIT_ALIAS, name=pi_init_name, cfg=cfg)
    if existing is not None and not fresh:
        local = pi_init_dir(cfg)
        if not (local / "config.json").exists():
            dst = cfg.paths.resolve("models") / "registry" / f"pi_init-v{existing.version}"
            local = registry.download_model_dir(cfg, str(existing.version), name=pi_init_name, dst=dst)
        return {"model_dir": local, "model_version": existing.version, "reused": True}
    res = train_sft(cfg, validation_fraction=cfg.experiment.validation_fraction, run_tags={registry.TASK_KEY_TAG: key})
    if res.mlflow_run_id:
        registry.record_task_result(
            res.mlflow_run_id, {"model_version": str(res.model_version), "model_dir": str(res.model_dir)}
        )
    return {
        "model_dir": res.model_dir,
        "model_version": res.model_version,
        "mlflow_run": res.mlflow_run_id,
        "reused": False,
        "metrics": {k: float(v) for k, v in (res.metrics or {}).items()},  # on the seeded held-out users
    }


def bootstrap_arms(cfg: Config, month: str = "") -> BootstrapResult:
    """Every arm gets a champion if it has none (see the module docstring). An arm that has one is checked against
    its promotion history first (abpo.arms.promotion.check_champion): a champion moved by hand in MLflow since the
    last recorded move is recorded (actor ``mlflow-ui``), pinned, and reported as ``moved_by_hand`` ({from, to}),
    which the DAG's bootstrap task turns into the arm's champion Asset event. An arm without a champion whose history
    names one is refused (abpo.arms.history.ChampionMissing), never bootstrapped again."""

    if check_gate_users(cfg.arms.gate_users) == "warehouse":  # a wrong gate setting stops the month here, not later
        check_holdout_fraction(cfg.arms.gate_holdout_fraction)
    out: dict[str, Any] = {}
    init = None
    init_scores: tuple[dict[str, float], list[int]] | None = None
    for arm in arms_of(cfg):
        mv = arm_versions.get_version(cfg, arm, CHAMPION)
        if mv is not None:
            out[arm] = {"version": str(mv.version), "bootstrapped": False}
            hand = promotion.check_champion(cfg, arm, month)
            if hand is not None:
                log.warning(f"bootstrap {arm}: {hand.reason}")
                out[arm].update(
                    version=hand.to_version, moved_by_hand={"from": hand.from_version, "to": hand.to_version}
                )
            continue
        # no champion: a new arm, unless its history names one (deleted outside abpo): then a refusal, never a silent
        # start-over from pi_init or a fresh fit
        require_champion_or_none_recorded(cfg, arm, arm_versions.model_name(arm, cfg))
        if entry(arm).kind == RANKER:
            res = refit(cfg, arm, None)
            out[arm] = {"version": res.version, "bootstrapped": True}
            continue
        if init is None:
            init = ensure_pi_init(cfg)
        tags = arm_versions.lineage_tags(
            cfg,
            kind=entry(arm).kind,
            source="pi_init",
            parent_version=None,
            months=[],
            data_hash="",
            variant=entry(arm).refreshed_by,
            pi_init_version=f"{registry.model_name(cfg)} v{init['model_version']}",
        )
        key, done = completed_step(cfg, "bootstrap", arm, f"pi_init-v{init['model_version']}")
        if done is not None:  # registered before, its champion alias since removed: the same version again
            mv = promotion.register_champion(cfg, arm, done["model_uri"], done["run_id"], tags)
        else:
            with start_run(cfg, f"bootstrap-{arm}", {"abpo.arm": arm, registry.TASK_KEY_TAG: key}) as run:
                uri = arm_versions.log_arm_model(cfg, arm, init["model_dir"])
            mv = promotion.register_champion(cfg, arm, uri, run.info.run_id, tags)
            registry.record_task_result(
                run.info.run_id, {"model_uri": uri, "run_id": run.info.run_id, "version": str(mv.version)}
            )
        log.info(f"bootstrap {arm}: {arm_versions.model_name(arm, cfg)} v{mv.version} (pi_init) is champion")
        # every LLM arm starts from the same checkpoint: its gate metrics and per-user ranks are computed once, not
        # per arm (the gate's paired test needs each user's rank, which pi_init's SFT evaluation does not keep).
        # With arms.gate_users = warehouse the gate's users are those of the gated month, unknown yet: the first
        # gate scores the champion on them (abpo.monthly.gate.offline_scores)
        if cfg.arms.gate_users != "warehouse":
            if init_scores is None:
                init_scores = offline_scores(cfg, arm, str(mv.version))
            else:
                record_offline_metrics(cfg, arm, str(mv.version), init_scores[0], ranks=init_scores[1])
        out[arm] = {"version": str(mv.version), "bootstrapped": True}
    if month:  # the champion each arm starts the month from, recorded once (a rerun keeps the first record)
        for arm, got in out.items():
            start = record_month_start(cfg, arm, month, got["version"])
            if start != got["version"]:
                log.info(
                    f"bootstrap {arm}: month {month} started from champion v{start} (recorded at its start; "
                    f"the champion is v{got['version']} now)"
                )
    return BootstrapResult(out)


class RegistryLost(arm_versions.NotInRegistry):
    """The state has completed months but its MLflow store holds no abpo model (a missing or zero-byte mlflow.db, a
    tracking URI pointing at another store): bootstrapping now would silently start the arms over from pi_init."""


def require_registry(cfg: Config, *, force: bool = False) -> None:
    """Refuse a store that lost the arms: with completed months (abpo.monthly.report.completed_months), the state's
    SQLite store missing or of 0 bytes (checked before anything opens it, which would create it), or any store in
    which no arm of arms.names has a registered model, raises RegistryLost naming the store, the completed months
    and the rule. ``force`` (``abpo arms month --force``; ``abpo arms bootstrap`` is the explicit start-over):
    nothing is checked."""
    done = completed_months(cfg)
    if force or not done:
        return
    rule = (
        f"rule: registry_matches_state: a state with {len(done)} completed month(s) ({done[0]}..{done[-1]}) keeps "
        "its arms' registered models, never silently bootstrapped again; restore the store (or point "
        "ABPO_TRACKING_URI / paths.mlflow_tracking_uri at it), or start over on purpose: abpo arms bootstrap, or "
        "abpo arms month --force"
    )
    db = registry.sqlite_path(cfg.paths.tracking_uri())
    if db is not None and (not db.exists() or db.stat().st_size == 0):
        raise RegistryLost(f"{db}: the MLflow store is {'missing' if not db.exists() else 'empty (0 bytes)'}; {rule}")
    for arm in arms_of(cfg):
        if registry.model_tags(cfg, arm_versions.model_name(arm, cfg)) is not None:
            return  # the arm's registered model is there
    names = ", ".join(arm_versions.model_name(a, cfg) for a in arms_of(cfg))
    raise RegistryLost(f"{registry.store_line(cfg)}: holds none of the arms' registered models ({names}); {rule}")


def registry_months(cfg: Config) -> list[str]:
    """The months the arms' champions were trained on (their lineage tag ``months``), as the registry records them."""
    months: set[str] = set()
    for arm in arms_of(cfg):
        mv = arm_versions.get_version(cfg, arm, CHAMPION)
        tags = dict(getattr(mv, "tags", None) or {}) if mv is not None else {}
        months.update(m.strip() for m in str(tags.get("months") or "").split(",") if m.strip())
    return sorted(months)


def bootstrap(cfg: Config, month: Month, *, force: bool = False) -> BootstrapResult:
    """The step: a store that lost the arms of a state with completed months is refused unless ``force``
    (:func:`require_registry`), a warehouse lost by a state whose cycle records or registry show months is refused
    (abpo.warehouse.require_warehouse: restore it, or start a fresh state; ``force`` does not skip it), a setting that changes the data split of the state's series is refused
    (abpo.monthly.series.check_series), a failed month m-1 blocks month m
    (abpo.monthly.report.require_previous_month), a month older than the last completed one and never ingested is
    refused (abpo.monthly.report.require_month_order), then :func:`bootstrap_arms`, which records the champion each
    arm starts the month from (abpo.monthly.common.record_month_start)."""

    from abpo.warehouse import require_warehouse

    require_registry(cfg, force=force)
    require_warehouse(cfg, registry_months(cfg))
    check_series(cfg, str(Month(month)))
    require_previous_month(cfg, Month(month))
    require_month_order(cfg, str(Month(month)))
    return bootstrap_arms(cfg, str(Month(month)))
