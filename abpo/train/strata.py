"""The rows an update trains on (D_bandit): the strata of an arm in its months read from the warehouse, without
the gate's held-out users (`read_update_strata`, `warehouse_strata`), and the update's own refusal of logged rows
whose propensity cannot be trusted (`refuse_untrusted_rows`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from abpo.config.arms import UPDATE_LOGS
from abpo.data.holdout import holdout_slice, holds_out
from abpo.errors import ExpectedError
from abpo.train.runs import UpdateInputMissing, UpdateRun

if TYPE_CHECKING:
    from abpo.config import Config

# the update's log name (abpo.train.update: where these lived before the split, and what operators filter on)
log = logging.getLogger("abpo.train.update")


@dataclass(frozen=True)
class HeldOut:
    """The rows of an update's months that D_bandit leaves out because their user is in the gate's held-out slice
    (config ``arms.gate_users = warehouse``, abpo.data.holdout)."""

    users: int  # held-out users with impressions of the arm in the months (of any arm when the arm is "")
    positive: int  # the arm's clicked rows of those users
    no_response: int  # the arm's no-response rows of those users

    @property
    def rows(self) -> int:
        return self.positive + self.no_response


def read_update_strata(
    cfg: Config,
    wh,
    months: Sequence[str],
    arm: str,
    *,
    gate_users: str,
    gate_holdout_fraction: float,
    gate_ope_rows: str = "all",
):
    """(positive, no_response, held_out) of arm ``arm`` (every arm's when "") in ``months``, read from the open
    warehouse ``wh``: the strata of D_bandit. When the gate reads the held-out users (abpo.data.holdout.holds_out:
    ``gate_ope_rows = heldout``, the off-policy half reads their rows, or ``gate_users = warehouse``, the offline half
    scores them) the rows of the gate's held-out users (the slice of ``gate_holdout_fraction`` among the months'
    users under ``cfg.seed``) are left out by an anti-join in DuckDB, and counted and logged in ``held_out`` (None
    otherwise: nothing is left out), so what the gate reads is what no update trained on. ``gate_users`` /
    ``gate_holdout_fraction`` / ``gate_ope_rows`` are config ``arms.gate_users`` / ``arms.gate_holdout_fraction`` /
    ``arms.gate_ope_rows``, passed by the caller (section ``arms`` sits above abpo.train in the layers)."""
    import pyarrow.compute as pc

    held = None
    if not holds_out(gate_users, gate_ope_rows):
        positive, no_response = wh.strata(months)
    else:
        excluded = holdout_slice(wh.impression_users(months), cfg.seed, gate_holdout_fraction)
        positive, no_response = wh.strata(months, exclude_users=excluded)
        counts = [r for r in wh.held_out_rows(months, excluded) if not arm or r["arm"] == arm]
        held = HeldOut(
            len(excluded) if not arm else sum(r["users"] for r in counts),
            sum(r["positive"] for r in counts),
            sum(r["no_response"] for r in counts),
        )
        log.info(
            f"update {arm or 'every arm'}, months {months}: held out {held.positive} positive + "
            f"{held.no_response} no-response rows of the gate's users ({held.users} users, "
            f"arms.gate_holdout_fraction={gate_holdout_fraction}, arms.gate_ope_rows={gate_ope_rows}, "
            f"arms.gate_users={gate_users})"
        )
    if arm:
        positive = positive.filter(pc.equal(positive.column("arm"), arm))
        no_response = no_response.filter(pc.equal(no_response.column("arm"), arm))
    return positive, no_response, held


class UntrustedLogRows(ExpectedError, ValueError):
    """Logged rows of an update's D_bandit whose propensity e0 cannot be trusted (or whose arm is not served):
    refused, never used; the message names arm, month, impression and rule of the first ones."""


def check_update_logs(value: str) -> str:
    """``value`` when it is one of UPDATE_LOGS (config arms.update_logs), else ValueError naming the key and rule."""
    if value not in UPDATE_LOGS:
        raise ValueError(f"arms.update_logs={value!r}; rule: one of {list(UPDATE_LOGS)}")
    return value


def _untrusted(arm: Any, p: Any, arms: set[str], min_propensity: float) -> str | None:
    """The rule a logged row breaks, or None: its arm is served (``arms``) and its e0 is a probability we can divide
    by (finite, in [min_propensity, 1], min_propensity > 0): the SNIPS weight w = e_old/e0 of docs/ABPO_SPEC.md
    step 3 is then finite and means what it says."""
    if arm not in arms:
        return f"arm not in arms.names {sorted(arms)}"
    if p is None:
        return "propensity missing"
    p = float(p)
    if not math.isfinite(p):
        return "propensity not finite"
    if p <= 0.0:
        return "propensity <= 0"
    if p > 1.0:
        return "propensity > 1"
    if p < min_propensity:
        return f"propensity below data.min_propensity={min_propensity}"
    return None


def refuse_untrusted_rows(tables, *, arms, min_propensity: float, updating: str, show: int = 5) -> None:
    """Raise UntrustedLogRows when any row of ``tables`` (the strata, IMPRESSIONS_SCHEMA columns month,
    impression_id, arm, propensity) breaks a rule of :func:`_untrusted`; the message names the first ``show`` rows
    (arm, month, impression, e0, rule) and how many there are. Ingest quarantines most such rows already
    (sql/ingest_check.sql); this is the update's own check, so a warehouse written another way cannot slip a
    row with a meaningless weight into D_bandit."""
    served = set(arms)
    bad = []
    for t in tables:
        cols = t.select(["month", "impression_id", "arm", "propensity"]).to_pydict()
        for m, i, a, p in zip(cols["month"], cols["impression_id"], cols["arm"], cols["propensity"], strict=True):
            rule = _untrusted(a, p, served, float(min_propensity))
            if rule is not None:
                bad.append(f"arm {a}, month {m}, impression {i}: e0 {p}; rule: {rule}")
    if bad:
        raise UntrustedLogRows(
            f"update of arm {updating}: {len(bad)} logged row(s) refused, none used: "
            + "; ".join(bad[:show])
            + (f"; ... and {len(bad) - show} more" if len(bad) > show else "")
        )


def logged_by(tables) -> dict[str, float]:
    """The share of the rows of ``tables`` logged by each arm (column ``arm``), by arm name; {} for no rows."""
    from collections import Counter

    counts: Counter[str] = Counter()
    for t in tables:
        counts.update(t.column("arm").to_pylist())
    total = sum(counts.values())
    return {a: counts[a] / total for a in sorted(counts)} if total else {}


def warehouse_strata(
    cfg: Config, run: UpdateRun, *, gate_users: str, gate_holdout_fraction: float, gate_ope_rows: str = "all"
):
    """(positive, no_response, months) of ``run.arm`` in ``run.months`` (every ingested month when empty), without
    the gate's held-out users (:func:`read_update_strata`, which the gate settings are passed on to)."""
    from abpo.warehouse import Warehouse

    path = cfg.paths.resolve("warehouse")
    if not path.exists():
        raise UpdateInputMissing(
            f"{path}: no warehouse yet; build and ingest the bandit log first: `abpo simulate-log --config "
            f"{cfg.name}` then `abpo ingest --month YYYY-MM --config {cfg.name}`"
        )
    with Warehouse(path, read_only=True) as wh:  # a reader: never holds the write lock
        months = list(run.months) or wh.months()
        if not months:
            raise UpdateInputMissing(
                f"{path}: no impressions ingested; build and ingest the bandit log first: `abpo simulate-log "
                f"--config {cfg.name}` then `abpo ingest --month YYYY-MM --config {cfg.name}`"
            )
        positive, no_response, _ = read_update_strata(
            cfg,
            wh,
            months,
            run.arm,
            gate_users=gate_users,
            gate_holdout_fraction=gate_holdout_fraction,
            gate_ope_rows=gate_ope_rows,
        )
    arm = run.arm
    if positive.num_rows + no_response.num_rows == 0:
        raise UpdateInputMissing(
            f"{path}: no impressions of arm {arm!r} in months {months}; build and ingest the bandit log first "
            f"(`abpo simulate-log --arm {arm}`, `abpo ingest`), or choose others (`abpo update --arm --month`)"
        )
    return positive, no_response, months
