"""The "Where ABPO differs from GRPO" table: one line per finished experiment (a logging regime on a dataset), read
from the experiment.json files abpo.experiment.runner writes. Per line: the regime (logger x clicks x log
candidates x G), ΔHR@5 and ΔNDCG@5 of ABPO (F) against vanilla GRPO (B) and against No-Update (A) after the last
round, each with its two-stage bootstrap interval and p (the F - B HR@5 contrast is the pre-registered primary one,
unadjusted; the others Holm-adjusted within their table), the MDE of F - B, F's weight diagnostics in the last
round (ŵ p99 and the weights' ESS share, means over its update steps and seeds), the trend test (F's HR@5 slope per
round minus B's) and the table's wall time. Nothing is recomputed: a line only restates its experiment's table."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROW, REFERENCE, BASE = "abpo", "grpo", "none"


def load_experiment(path: Path) -> dict[str, Any]:
    """An experiment's experiment.json (``path`` is the file or its directory)."""
    f = path / "experiment.json" if path.is_dir() else path
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no experiment.json (rule: a finished `abpo experiment` writes one)")
    return json.loads(f.read_text())


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and v is not None else float("nan")


def _p(p) -> str:
    p = _num(p)
    return "-" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _diff(rec: Mapping, ref: str, metric: str, primary: bool = False) -> str:
    d = _num(rec.get(f"vs_{ref}_d{metric}"))
    if math.isnan(d):
        return "-"
    lo, hi = _num(rec.get(f"vs_{ref}_ci_low_{metric}")), _num(rec.get(f"vs_{ref}_ci_high_{metric}"))
    p = (
        f"{_p(rec.get(f'vs_{ref}_p_{metric}'))}, primary"
        if primary
        else _p(rec.get(f"vs_{ref}_p_holm_{metric}", rec.get(f"vs_{ref}_p_{metric}")))
    )
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if not math.isnan(lo) else ""
    return f"{d:+.4f}{ci} ({p})"


def regime_label(summary: Mapping[str, Any]) -> str:
    """logger x clicks x log candidates x G, as the experiment's summary records them."""
    cands = {"offline": "M = 20 offline", "paper": "M = 200 uniform"}.get(
        summary.get("log_candidates", "offline"), str(summary.get("log_candidates"))
    )
    logger = summary.get("logger", "on_policy")
    return f"{logger} × {summary.get('clicks', 'next_item')} clicks × {cands} × G = {summary.get('group_size', '?')}"


def regime_line(exp: Mapping[str, Any]) -> dict[str, str]:
    """One line of the table from one experiment.json."""
    s = exp["summary"]
    by_row = {r["row"]: r for r in exp.get("table", [])}
    if ROW not in by_row or REFERENCE not in by_row:
        raise ValueError(
            f"experiment {s.get('name')}: rows {sorted(by_row)}; rule: the regime table needs rows "
            f"{ROW} and {REFERENCE}"
        )
    f = by_row[ROW]
    primary = str(s.get("primary_contrast", "abpo-grpo")) in ("abpo-grpo", "F-B")
    last = [r for r in exp.get("rounds", []) if r["row"] == ROW]
    last = last[-1] if last else {}
    w99, ess = _num(last.get("train_w_p99")), _num(last.get("train_w_ess_share"))
    trend = "-"
    if "trend_vs_grpo_dslope_HR@5" in last:
        lo, hi = _num(last.get("trend_vs_grpo_dslope_ci_low_HR@5")), _num(last.get("trend_vs_grpo_dslope_ci_high_HR@5"))
        trend = (
            f"{_num(last['trend_vs_grpo_dslope_HR@5']):+.4f} [{lo:+.4f}, {hi:+.4f}] "
            f"({_p(last.get('trend_vs_grpo_dslope_p_holm_HR@5', last.get('trend_vs_grpo_dslope_p_HR@5')))})"
        )
    return {
        "dataset": str(s.get("dataset", "?")).split(":")[-1],
        "experiment": str(s.get("name")),
        "regime": regime_label(s),
        "design": f"{s.get('seeds')} seeds × {s.get('eval_users')} {s.get('eval_split')} users, "
        f"{s.get('rounds')} round(s)",
        "F - B HR@5": _diff(f, REFERENCE, "HR@5", primary),
        "F - B NDCG@5": _diff(f, REFERENCE, "NDCG@5"),
        "MDE F - B": f"{_num(f.get('vs_grpo_mde_HR@5')):.4f}",
        "F - A HR@5": _diff(f, BASE, "HR@5"),
        "F - A NDCG@5": _diff(f, BASE, "NDCG@5"),
        "ŵ p99 / ESS share (F, last round)": "-" if math.isnan(w99) else f"{w99:.2f} / {ess:.2f}",
        "Δ slope HR@5 F - B per round": trend,
        "wall": f"{_num(s.get('wall_seconds')) / 60:.1f} min",
    }


def regime_table(paths: Sequence[Path]) -> str:
    """The markdown table, one line per experiment in ``paths`` (in that order), and its legend."""
    lines = [regime_line(load_experiment(Path(p))) for p in paths]
    if not lines:
        raise ValueError("no experiments given (rule: name at least one finished experiment)")
    head = list(lines[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(line[k] for k in head) + " |" for line in lines]
    out += [
        "",
        "Δ [95% two-stage bootstrap interval: seeds, then users] (p). F - B on HR@5 after the last round is "
        "each table's pre-registered primary contrast (p unadjusted, marked 'primary'); the other p are "
        "Holm-adjusted within their table. MDE: the minimum detectable F - B HR@5 at 80% power. ŵ: the update's "
        "self-normalised SNIPS weights (abpo/w_p99, abpo/w_ess_share, means over steps and seeds). Δ slope: the "
        "per-(seed, user) least-squares HR@5 slope over rounds, F minus B (Holm within the table).",
    ]
    return "\n".join(out) + "\n"
