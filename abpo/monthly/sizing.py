"""`abpo arms size-update`: choose how big an LLM arm's monthly update is (rows, learning rate, epochs) on a simulated
*validation* month, never on the months a report covers.

What it does, in the state it is given (``paths.root``: a throw-away state of its own, e.g. the demo config with
``seed=1`` and another ``sim.salt``, so its traffic, arm assignment, candidates and clicks are not the reported
series'):

1. the month's bootstrap, serve (simulated) and ingest + GX, as the DAG runs them (abpo.monthly.bootstrap, serve,
   ingest; a rerun reuses them);
2. for every point of the grid (``--grid key=v1,v2``: the product of the axes, e.g. ``arms.update_max_examples``,
   ``update.learning_rate``, ``update.epochs``): the arm's update from its champion on the month's logs
   (abpo.monthly.update.update, with ``arms.update_logs`` as configured), registered as the challenger
   and gated against the champion (abpo.monthly.gate.gate). Nothing is promoted: every point starts from the
   same champion.

Each point reports the update's wall time and steps, the gate's paired offline test (Δ HR@5 with its SE, the
one-sided lower bound and the MDE) and the off-policy SNIPS CTR difference with its 95% interval. A point **moves
the policy beyond the gate's noise** when |Δ HR@5| > z_{0.975}·SE (the paired SE of the gate's users) or the
off-policy interval excludes 0 (:func:`moves_beyond_noise`): an update that moves less than that cannot be told
from no update by the gate that decides its promotion.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.arms.names import LLM, entry
from abpo.monthly.bootstrap import bootstrap
from abpo.monthly.gate import gate
from abpo.monthly.ingest import ingest
from abpo.monthly.register import register
from abpo.monthly.update import update
from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)

Z_975 = 1.959963984540054


@dataclasses.dataclass
class SizingPoint:
    """One grid point: the overrides, the update's size and time, and the gate's numbers."""

    overrides: list[str]
    rows: int  # logged rows in the month's D_bandit (before arms.update_max_examples subsamples them)
    steps: int
    update_seconds: float
    version: str  # the challenger it registered
    offline: dict[str, Any]  # abpo.evaluation.paired.PairedTest's numbers
    off_policy: dict[str, Any] | None  # abpo.evaluation.off_policy.compare_snips' numbers
    gate_passed: bool
    moves: bool  # moves_beyond_noise

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def snips_numbers(off_policy: dict[str, Any] | None) -> dict[str, float]:
    """The gate's SNIPS CTR difference on the arm's own rows (the sizing rule's target, docs/loop.md), whichever
    estimator decided the gate (off_policy.estimates["snips"]; a result written before the estimates were nested has it at the top),
    a number the gate could not compute (None in its JSON result) as NaN; {} when the half did not run."""
    if not off_policy:
        return {}
    d = (off_policy.get("estimates") or {}).get("snips", off_policy)
    return {k: float("nan") if d.get(k) is None else float(d[k]) for k in ("diff", "ci_low", "ci_high")}


def moves_beyond_noise(offline: dict[str, Any], off_policy: dict[str, Any] | None) -> bool:
    """True when the gate can tell the update from no update: |Δ| > z_{0.975}·SE of the paired offline test, or the
    off-policy 95% interval of the SNIPS CTR difference excludes 0."""
    diff, se = float(offline.get("diff", float("nan"))), float(offline.get("se", float("nan")))
    offline_moves = math.isfinite(diff) and math.isfinite(se) and (abs(diff) > Z_975 * se if se > 0 else diff != 0)
    ope_moves = False
    if off_policy:
        lo, hi = snips_numbers(off_policy)["ci_low"], snips_numbers(off_policy)["ci_high"]
        ope_moves = math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0)
    return bool(offline_moves or ope_moves)


def size_update(
    cfg: Config, month: str, arm: str, grid: Sequence[Sequence[str]], config_for: Callable[[Sequence[str]], Any]
) -> list[SizingPoint]:
    """Run the grid (each point a list of ``key=value`` overrides, made into a config by ``config_for``) on ``month``
    of ``cfg``'s state, for LLM arm ``arm``. Returns one SizingPoint per grid point, in grid order."""
    from abpo.monthly.serve import serve

    if entry(arm).kind != LLM:
        raise ValueError(f"abpo arms size-update --arm {arm}: a {entry(arm).kind} arm; rule: an updated LLM arm")
    for overrides in grid:  # before any step runs: a point whose rows the arm's own entry would override
        c = config_for(list(overrides))
        if arm in c.arms.update_max_examples_by_arm and any(
            o.partition("=")[0] == "arms.update_max_examples" for o in overrides
        ):
            raise ValueError(
                f"abpo arms size-update: grid point {list(overrides)} sets arms.update_max_examples, but "
                f"arms.update_max_examples_by_arm gives {arm} its own ({c.arms.update_max_examples_by_arm[arm]}); "
                "rule: drop its entry for the grid (--set 'arms.update_max_examples_by_arm={}')"
            )
    m = Month(month)
    bootstrap(cfg, m)
    serve(cfg, m, simulate=True)
    ingest(cfg, m)
    points = []
    for overrides in grid:
        c = config_for(list(overrides))
        if c.paths.resolve("root") != cfg.paths.resolve("root"):
            raise ValueError(
                f"abpo arms size-update: grid point {list(overrides)} moves paths.root; rule: every "
                "point runs in the same state"
            )
        t0 = time.time()
        upd = update(c, arm, m)
        seconds = time.time() - t0
        reg = register(c, arm, upd)
        g = gate(c, arm, reg.version, str(m))
        offline = dict(g.offline or {})
        point = SizingPoint(
            overrides=list(overrides),
            rows=upd.rows,
            steps=upd.steps,
            update_seconds=round(seconds, 1),
            version=reg.version,
            offline=offline,
            off_policy=g.off_policy,
            gate_passed=bool(g.passed),
            moves=moves_beyond_noise(offline, g.off_policy),
        )
        log.info(
            f"size-update {arm} {' '.join(overrides) or '(config as is)'}: {point.steps} steps in "
            f"{point.update_seconds:.0f}s; {sizing_line(point)}"
        )
        points.append(point)
    return points


def sizing_line(p: SizingPoint) -> str:
    o, ope = p.offline, snips_numbers(p.off_policy)
    text = (
        f"offline ΔHR@5 {o.get('diff', float('nan')):+.4f} (SE {o.get('se', float('nan')):.4f}, "
        f"{o.get('wins', 0)} won / {o.get('losses', 0)} lost, MDE {o.get('mde', float('nan')):.4f})"
    )
    if ope:
        text += (
            f", SNIPS ΔCTR {ope.get('diff', float('nan')):+.4f} "
            f"[{ope.get('ci_low', float('nan')):+.4f}, {ope.get('ci_high', float('nan')):+.4f}]"
        )
    return text + f"; gate {'PASS' if p.gate_passed else 'FAIL'}; {'moves' if p.moves else 'within noise'}"


def write_sizing(out: Path, markdown: str, points: Sequence[SizingPoint]) -> None:
    """The grid's table (``markdown``, :func:`sizing_markdown`) into ``out`` and its points as JSON beside it (same
    name, ``.json``); the folder is made."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    out.with_suffix(".json").write_text(json.dumps([p.to_json() for p in points], indent=1))


def sizing_markdown(points: Sequence[SizingPoint], *, arm: str, month: str) -> str:
    """The grid as a markdown table."""
    head = [
        "Overrides",
        "Steps",
        "Update s",
        "ΔHR@5 (SE)",
        "won/lost",
        "MDE",
        "SNIPS ΔCTR [95% CI]",
        "Gate",
        "Beyond noise",
    ]
    lines = [
        f"### Update size on validation month {month}, arm {arm}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for p in points:
        o, ope = p.offline, snips_numbers(p.off_policy)
        ope_text = f"{ope['diff']:+.4f} [{ope['ci_low']:+.4f}, {ope['ci_high']:+.4f}]" if ope else "-"
        lines.append(
            "| "
            + " | ".join(
                [
                    " ".join(p.overrides) or "(config)",
                    str(p.steps),
                    f"{p.update_seconds:.0f}",
                    f"{o.get('diff', float('nan')):+.4f} ({o.get('se', float('nan')):.4f})",
                    f"{o.get('wins', 0)}/{o.get('losses', 0)}",
                    f"{o.get('mde', float('nan')):.4f}",
                    ope_text,
                    "PASS" if p.gate_passed else "FAIL",
                    "yes" if p.moves else "no",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"
