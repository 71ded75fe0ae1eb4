"""Step ``refit`` (Airflow task ``<arm>.refit``, one per ranker arm): the arm refitted on everything seen through
month m (the interactions to date and every click logged before), registered with lineage and made champion at once
(a refit has no gate: it is the arm's definition, retrained). The bootstrap's first fit is the same step with no
month."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import promotion, versions as arm_versions
from abpo.arms.names import RANKER, RANKER_ARMS, arm_class, entry
from abpo.monthly.common import CHAMPION, StepResult, completed_step, dataset_and_splits, start_run
from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RefitResult(StepResult):
    arm: str
    version: str  # the new champion
    months: list[str]  # the warehouse months whose clicks it saw
    previous_version: str = ""  # the champion when the step started ("" when there was none)
    moved: bool = True  # the champion is another version than when the step started (the DAG's Asset event)


def ranker_training_sequences(cfg: Config, month: Month | None) -> tuple[dict[int, list[int]], list[str]]:
    """Per user, chronological: the history before the first month (the dataset's x_{1:T}), then, through ``month``
    (None: nothing more), the interactions the warehouse holds and every click logged; and the months covered."""
    from abpo.warehouse import open_warehouse

    _, splits = dataset_and_splits(cfg)
    seqs = {s.user_id: list(s.history) for s in splits}
    if month is None:
        return seqs, []
    with open_warehouse(cfg, read_only=True) as wh:
        for u, items in wh.interactions_to_date(month).items():
            seqs.setdefault(u, []).extend(items)
        clicks = wh.run("clicks_to_date", month=month)
        months = [m for m in wh.months() if m <= month]
    for u, i in zip(clicks.column("user_id").to_pylist(), clicks.column("item_id").to_pylist()):
        seqs.setdefault(int(u), []).append(int(i))
    return seqs, months


def refit(cfg: Config, arm: str, month: Month | None) -> RefitResult:
    """Refit a ranker arm on everything seen through ``month`` (None: the bootstrap fit), register it with lineage
    and make it champion (a refit has no gate: it is the arm's definition, retrained)."""
    if entry(arm).kind != RANKER:
        raise ValueError(f"refit: {arm!r} is an LLM arm; rule: one of {list(RANKER_ARMS)}")
    ds, splits = dataset_and_splits(cfg)
    t = time.time()
    before = arm_versions.get_version(cfg, arm, CHAMPION)
    previous = str(before.version) if before is not None else ""
    seqs, months = ranker_training_sequences(cfg, month)
    data_hash = hashlib.sha256(json.dumps(sorted(seqs.items())).encode()).hexdigest()[:16]
    key, done = completed_step(cfg, "refit", arm, month or "bootstrap", data_hash, result=RefitResult)
    if done is not None:  # the same refit completed before (a re-run): nothing fitted, registered or moved now
        return dataclasses.replace(done, previous_version=previous, moved=False)
    cls: Any = arm_class(arm)  # a ranker arm's class (abpo.arms.rankers.RankerArm)
    inputs = cls.fit_inputs(arm, cfg, month, ds, splits)  # SASRec-CE: the champion to warm-start from
    fitted = cls.refresh(arm, cfg, sequences=seqs, item_ids=ds.item_ids().tolist(), **inputs)
    out_dir = fitted.save(cfg.paths.resolve("models") / "arms" / arm / (month or "bootstrap"))
    tags = arm_versions.lineage_tags(
        cfg,
        kind="ranker",
        source="refit" if month else "bootstrap",
        parent_version=previous or None,
        months=months,
        data_hash=data_hash,
        variant=arm,
        interactions=sum(map(len, seqs.values())),
    )
    with start_run(
        cfg,
        f"refit-{arm}-{month or 'bootstrap'}",
        {"abpo.arm": arm, "abpo.month": month or "", registry.TASK_KEY_TAG: key},
    ) as run:
        import pandas as pd

        uri = arm_versions.log_arm_model(cfg, arm, out_dir)
        # what it was fitted on, as an MLflow dataset input: every (user, item) in order, digest = data_hash
        pairs = [(u, i, p) for u, items in sorted(seqs.items()) for p, i in enumerate(items)]
        registry.log_dataset_input(
            pd.DataFrame(pairs, columns=["user_id", "item_id", "position"]),
            name=f"{arm}-interactions-through-{month or 'bootstrap'}",
            digest=data_hash,
            source=cfg.paths.resolve("warehouse"),
            tags={"months": ",".join(months)},
        )
    mv = arm_versions.register_version(cfg, arm, uri, run.info.run_id, tags, alias=None)
    promoted = promotion.promote(
        cfg,
        arm,
        mv.version,
        reason=f"refit through {month or 'the start'}",
        actor="abpo",
        action="refit",
        month=month or "",
        respect_pin=True,
    )
    champion = promoted["champion"]  # a pinned arm keeps its champion (abpo arms pin): the refit stays registered
    log.info(
        f"refit {arm}: {sum(map(len, seqs.values()))} interactions and clicks through {month or 'the start'} "
        f"in {time.time() - t:.1f}s -> {arm_versions.model_name(arm, cfg)} v{mv.version}, "
        + ("champion" if champion == str(mv.version) else f"not champion ({promoted.get('reason', '')})")
    )
    out = RefitResult(
        arm=arm, version=str(mv.version), months=months, previous_version=previous, moved=champion != previous
    )
    registry.record_task_result(run.info.run_id, out.to_json())
    return out
