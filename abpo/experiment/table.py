"""The experiment's tables as records: per row, the mean ± std over seeds and the paired comparisons against
No-Update (A) and vanilla GRPO (B), Holm-adjusted except the primary contrast; per (row, round), the rounds' curves
and the trend test (abpo.experiment.stats)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from abpo.experiment.match_rates import training_diagnostics
from abpo.experiment.rows import is_llm_row, row_key, row_label
from abpo.experiment.stats import holm, paired_comparison, trend_comparison


def paired_tests(cells_a: Sequence[Mapping], cells_b: Sequence[Mapping], **kw) -> dict[str, float]:
    """Row a against row b over the same (seed, user) units: abpo.experiment.stats.paired_comparison (Δ, the
    two-stage bootstrap interval, p and SE, MDE; McNemar and Wilcoxon as extra columns; non-inferiority with
    ``margin`` / ``relative_margin``). Differences are a - b."""

    return paired_comparison(cells_a, cells_b, **kw)


METRICS = ("HR@1", "HR@5", "NDCG@5", "Diversity@1", "Diversity@5")
ROUND_METRICS = ("HR@5", "NDCG@5", "Diversity@5", "match_positive", "match_no_response", "ope_snips")
ROUND_DIAGNOSTICS = (
    "train_match_positive",
    "train_match_no_response",
    "train_w_p99",
    "train_w_ess_share",
    "train_gamma_ratio",
    "train_no_response_abs_share",
)
TESTED = ("HR@5", "NDCG@5")  # the metrics with paired comparisons
REFERENCES = ("none", "grpo")  # every row is compared with No-Update (A) and vanilla GRPO (B)


def _mean_std(vals) -> tuple[float, float]:
    v = np.asarray([x for x in vals if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def primary_contrast(spec: str) -> tuple[str, str]:
    """experiment.primary_contrast 'ROW-REFERENCE' (names or letters, e.g. 'abpo-grpo' or 'F-B') as canonical row
    names (row, reference)."""
    parts = [x.strip() for x in str(spec).split("-")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"experiment.primary_contrast={spec!r}; rule: 'ROW-REFERENCE', e.g. 'abpo-grpo'")
    row, ref = (row_key(x) for x in parts)
    if row == ref:
        raise ValueError(f"experiment.primary_contrast={spec!r}; rule: two different rows")
    return row, ref


def _by_row(cells: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    by_row: dict[str, list[Mapping]] = {}
    for c in cells:
        by_row.setdefault(c["row"], []).append(c)
    return by_row


def table_rows(cells: Sequence[Mapping], rows: Sequence[str], experiment_cfg=None) -> list[dict[str, Any]]:
    """One dict per row: mean and std over seeds of every metric, and the paired comparisons (abpo.experiment.stats,
    two-stage bootstrap) against No-Update (with both non-inferiority tests) and against vanilla GRPO.

    The pre-registered primary contrast (experiment.primary_contrast, HR@5 of ROW minus REFERENCE) keeps its
    unadjusted p and is marked ``vs_<ref>_primary``; every other p of the table (each row against A and B, HR@5 and
    NDCG@5; A vs B and B vs A counted once) is one family, Holm-adjusted into ``vs_<ref>_p_holm_<metric>``."""

    e = experiment_cfg
    kw = {} if e is None else {"bootstrap_samples": e.bootstrap_samples, "alpha": e.alpha, "power": e.power}
    primary = primary_contrast(e.primary_contrast if e is not None else "abpo-grpo")
    by_row = _by_row(cells)
    out, contrasts = [], []
    for row in rows:
        cs = sorted(by_row.get(row, []), key=lambda c: c["seed"])
        if not cs:
            continue
        rec: dict[str, Any] = {"row": row, "label": row_label(row), "seeds": len(cs)}
        for m in (*METRICS, "match_positive", "match_no_response"):
            if all(m in c for c in cs):
                rec[m], rec[f"{m}_std"] = _mean_std([c[m] for c in cs])
        refs = [*REFERENCES, *([primary[1]] if row == primary[0] and primary[1] not in REFERENCES else [])]
        for ref in refs:
            if row != ref and ref in by_row:
                ni = {}
                if e is not None and ref == "none":
                    ni = {
                        "margin": e.noninferiority_margin,
                        "relative_margin": e.noninferiority_relative_margin,
                        "ni_alpha": e.noninferiority_alpha,
                    }
                for k, v in paired_tests(cs, by_row[ref], **ni, **kw).items():
                    rec[f"vs_{ref}_{k}"] = v
                contrasts.append((rec, ref))
                if (row, ref) == primary:
                    rec[f"vs_{ref}_primary"] = True
                    rec["primary_reference"] = ref
        out.append(rec)
    # the family: one member per unordered pair of rows and metric (A vs B and B vs A are one comparison, same p)
    family: dict[tuple[frozenset, str], list[tuple[dict, str]]] = {}
    for rec, ref in contrasts:
        for m in TESTED:
            if f"vs_{ref}_p_{m}" in rec and not (rec.get(f"vs_{ref}_primary") and m == "HR@5"):
                family.setdefault((frozenset((rec["row"], ref)), m), []).append((rec, ref))
    members = list(family.items())
    adjusted = holm([pairs[0][0][f"vs_{pairs[0][1]}_p_{m}"] for (_, m), pairs in members])
    for ((_, m), pairs), adj in zip(members, adjusted):
        for rec, ref in pairs:
            rec[f"vs_{ref}_p_holm_{m}"] = adj
    return out


def round_rows(cells: Sequence[Mapping], rows: Sequence[str], experiment_cfg=None) -> list[dict[str, Any]]:
    """Per (row, round) of the LLM rows: mean and std over seeds of ROUND_METRICS (the rounds' curves). With more
    than one round, the row's last round also carries the trend test (abpo.experiment.stats.trend_comparison:
    per-(seed, user) slope over rounds, two-stage bootstrap): ``trend_slope_*`` against 0 and, for rows other than
    B, ``trend_vs_grpo_dslope_*`` against vanilla GRPO, whose HR@5 p-values are Holm-adjusted as one family
    (``trend_vs_grpo_dslope_p_holm_HR@5``)."""

    e = experiment_cfg
    kw = {} if e is None else {"bootstrap_samples": e.bootstrap_samples, "alpha": e.alpha}
    groups: dict[tuple[str, int], list[Mapping]] = {}
    for c in cells:
        if is_llm_row(c["row"]):
            groups.setdefault((c["row"], int(c["round"])), []).append(c)
    llm_cells = _by_row([c for cs in groups.values() for c in cs])
    out = []
    for row in rows:
        recs = []
        for (rw, r), cs in sorted(groups.items(), key=lambda kv: kv[0][1]):
            if rw != row:
                continue
            rec: dict[str, Any] = {"row": row, "label": row_label(row), "round": r, "seeds": len(cs)}
            for m in ROUND_METRICS:
                rec[m], rec[f"{m}_std"] = _mean_std([c.get(m) for c in cs])
            diag = [training_diagnostics(c) for c in cs]
            for m in ROUND_DIAGNOSTICS:
                rec[m], rec[f"{m}_std"] = _mean_std([d[m] for d in diag])
            recs.append(rec)
        if len(recs) > 1 and all("ranks" in c for c in llm_cells[row]):
            ref = llm_cells.get("grpo") if row != "grpo" else None
            t = trend_comparison(llm_cells[row], ref, **kw)
            recs[-1].update(
                {
                    k if k.startswith("trend") else f"trend_{k}" if k.startswith("slope") else f"trend_vs_grpo_{k}": v
                    for k, v in t.items()
                }
            )
        out += recs
    family = [r for r in out if "trend_vs_grpo_dslope_p_HR@5" in r]
    for fam, adj in zip(family, holm([f["trend_vs_grpo_dslope_p_HR@5"] for f in family])):
        fam["trend_vs_grpo_dslope_p_holm_HR@5"] = adj
    return out
