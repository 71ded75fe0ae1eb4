"""The experiment's tables as markdown (table.md): the metrics and comparisons table, and the rounds table with
its trend columns."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from abpo.experiment.rows import row_label
from abpo.experiment.table import METRICS, REFERENCES, ROUND_DIAGNOSTICS, ROUND_METRICS


def _fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _fmt_interval(d: float, lo: float | None, hi: float | None, p: str) -> str:
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if lo is not None and math.isfinite(lo) else ""
    return f"{d:+.4f}{ci} ({p})"


def _fmt_diff(r: Mapping, ref: str, metric: str) -> str:
    """Δ [interval] (p): the Holm-adjusted p, or the unadjusted p marked 'primary' for the primary contrast."""
    key = f"vs_{ref}_d{metric}"
    if key not in r:
        return "-"
    if r.get(f"vs_{ref}_primary") and metric == "HR@5":
        p = f"{_fmt_p(r.get(f'vs_{ref}_p_{metric}'))}, primary"
    else:
        p = _fmt_p(r.get(f"vs_{ref}_p_holm_{metric}", r.get(f"vs_{ref}_p_{metric}")))
    return _fmt_interval(r[key], r.get(f"vs_{ref}_ci_low_{metric}"), r.get(f"vs_{ref}_ci_high_{metric}"), p)


def _fmt_ni(r: Mapping) -> str:
    parts = []
    if "vs_none_non_inferior" in r:
        parts.append(
            f"abs {r['vs_none_ni_margin']:g}: {'yes' if r['vs_none_non_inferior'] else 'no'} "
            f"({_fmt_p(r['vs_none_ni_p'])})"
        )
    if "vs_none_non_inferior_rel" in r:
        parts.append(
            f"rel {100 * r['vs_none_ni_rel_share']:g}% (= {r['vs_none_ni_rel_margin']:.4f}): "
            f"{'yes' if r['vs_none_non_inferior_rel'] else 'no'} ({_fmt_p(r['vs_none_ni_rel_p'])})"
        )
    return "; ".join(parts) or "-"


def table_markdown(recs: Sequence[Mapping], *, title: str, note: str = "") -> str:
    """The metrics table (mean ± std over seeds) and the comparisons table (Δ [95% two-stage bootstrap interval]
    (p, Holm-adjusted; the primary contrast unadjusted and marked), MDE, non-inferiority)."""
    head = ["Row", *METRICS]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        cells = [r["label"]]
        for m in METRICS:
            digits = 2 if m.startswith("Diversity") else 4  # Diversity is on a 0-100 scale
            cells.append(f"{r[m]:.{digits}f} ± {r[m + '_std']:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    comp = [
        "Row",
        "ΔHR@5 vs A [95% CI] (p Holm)",
        "MDE HR@5 vs A",
        "Non-inferior to A (one-sided p)",
        "ΔNDCG@5 vs A [95% CI] (p Holm)",
        "ΔHR@5 vs B [95% CI] (p Holm)",
        "MDE HR@5 vs B",
        "ΔNDCG@5 vs B [95% CI] (p Holm)",
    ]
    lines += ["", "| " + " | ".join(comp) + " |", "|" + "---|" * len(comp)]
    for r in recs:
        if not any(k.startswith("vs_") for k in r):
            continue
        mde = {ref: (f"{r[f'vs_{ref}_mde_HR@5']:.4f}" if f"vs_{ref}_mde_HR@5" in r else "-") for ref in REFERENCES}
        lines.append(
            "| "
            + " | ".join(
                [
                    r["label"],
                    _fmt_diff(r, "none", "HR@5"),
                    mde["none"],
                    _fmt_ni(r),
                    _fmt_diff(r, "none", "NDCG@5"),
                    _fmt_diff(r, "grpo", "HR@5"),
                    mde["grpo"],
                    _fmt_diff(r, "grpo", "NDCG@5"),
                ]
            )
            + " |"
        )
    for r in recs:  # a primary contrast against another reference than A or B: its own line
        ref = r.get("primary_reference")
        if ref is not None and ref not in REFERENCES:
            lines += ["", f"Primary contrast {r['label']} vs {row_label(ref)}: ΔHR@5 {_fmt_diff(r, ref, 'HR@5')}"]
    lines += [
        "",
        "Intervals: 95% two-stage bootstrap (seeds, then users); p: two-sided, percentile inversion of the "
        "same bootstrap, Holm-adjusted over every comparison in this table except the primary contrast "
        "(marked 'primary', unadjusted).",
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _fmt_trend(r: Mapping, prefix: str, p_key: str) -> str:
    if f"{prefix}_HR@5" not in r:
        return "-"
    p = _fmt_p(r.get(p_key))
    return _fmt_interval(
        r[f"{prefix}_HR@5"],
        r.get(f"{prefix.replace('slope', 'slope_ci_low')}_HR@5"),
        r.get(f"{prefix.replace('slope', 'slope_ci_high')}_HR@5"),
        p,
    )


def rounds_markdown(recs: Sequence[Mapping]) -> str:
    """The rounds table; with a trend test (more than one round) two more columns on each row's last round: the
    HR@5 slope per round [95% two-stage interval] (p against 0) and its difference against B (p, Holm)."""
    trend = any("trend_slope_HR@5" in r for r in recs)
    diag = [m for m in ROUND_DIAGNOSTICS if any(math.isfinite(r.get(m, float("nan"))) for r in recs)]
    names = {
        "ope_snips": "off-policy CTR (SNIPS, own log)",
        "train_match_positive": "train match, positive",
        "train_match_no_response": "train match, no-response",
        "train_w_p99": "ŵ p99 (train)",
        "train_w_ess_share": "ESS share (train)",
        "train_gamma_ratio": "γ ratio vs B (train)",
        "train_no_response_abs_share": "no-response share of |A| (train)",
    }
    head = ["Row", "Round", *(names.get(m, m) for m in (*ROUND_METRICS, *diag))]
    if trend:
        head += ["HR@5 slope/round [95% CI] (p)", "Δ slope HR@5 vs B [95% CI] (p Holm)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        digits = {m: 2 if m.startswith("Diversity") else 4 for m in ROUND_METRICS}  # Diversity: a 0-100 scale
        vals = [
            f"{r[m]:.{digits[m]}f} ± {r[m + '_std']:.{digits[m]}f}" if math.isfinite(r.get(m, float("nan"))) else "-"
            for m in ROUND_METRICS
        ]
        vals += [f"{r[m]:.3f}" if math.isfinite(r.get(m, float("nan"))) else "-" for m in diag]
        if trend:
            vals += [
                _fmt_trend(r, "trend_slope", "trend_slope_p_HR@5"),
                _fmt_trend(r, "trend_vs_grpo_dslope", "trend_vs_grpo_dslope_p_holm_HR@5"),
            ]
        lines.append("| " + " | ".join([r["label"], str(r["round"]), *vals]) + " |")
    if trend:
        lines += [
            "",
            "Trend: per (seed, user) least-squares slope of the HR@5 hit over rounds 1..R, averaged; 95% "
            "two-stage bootstrap (seeds, then users); the Δ slope p-values vs B are Holm-adjusted as one family.",
        ]
    return "\n".join(lines) + "\n"
