"""The experiment's files in <exp>/: table.csv, table.md, ablation.png, rounds.csv, rounds.png,
training_match.png and experiment.json (each written, then renamed)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from abpo.experiment.markdown import rounds_markdown, table_markdown
from abpo.experiment.rows import BASELINES, row_label
from abpo.experiment.table import ROUND_METRICS


def _plot_rounds(path: Path, rounds_recs: Sequence[Mapping], table: Sequence[Mapping]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(ROUND_METRICS), figsize=(4 * len(ROUND_METRICS), 3.6))
    rows = list(dict.fromkeys(r["row"] for r in rounds_recs))
    pi0 = next((r for r in rounds_recs if r["row"] == "none" and r["round"] == 1), None)  # pi_init itself
    for ax, m in zip(axes, ROUND_METRICS):
        for row in rows:
            pts = [r for r in rounds_recs if r["row"] == row]
            xs, ys = [r["round"] for r in pts], [r[m] for r in pts]
            if pi0 is not None and not m.startswith(("match", "ope")):  # round 0: pi_init, where every row starts
                xs, ys = [0, *xs], [pi0[m], *ys]
            ax.plot(xs, ys, marker="o", label=pts[0]["label"], lw=2.2 if row == "abpo" else 1.2)
        for t in table:
            if t["row"] in BASELINES and m in t:
                ax.axhline(t[m], ls="--", lw=0.8, color="grey")
        ax.set_title(
            m.replace("match_positive", "match rate, positive")
            .replace("match_no_response", "match rate, no-response")
            .replace("ope_snips", "off-policy CTR (SNIPS, own log)"),
            fontsize=9,
        )
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def training_match_curves(cells: Sequence[Mapping], bins: int = 10) -> dict[str, dict[str, tuple[list, list]]]:
    """The paper's Fig. 2 quantity over successive rounds: per updated row and stratum, the training-time rollout
    match rate (abpo/match_rate/positive | no_response of the update's logged steps) against the position in
    training, x = (round - 1) + (step - 1) / steps of that round, averaged in ``bins`` equal bins per round over the
    row's seeds. Returns {row: {stratum: (xs, ys)}}; strata 'positive' and 'no_response'."""
    acc: dict[tuple[str, str, int, int], list[float]] = {}
    for c in cells:
        hist = [h for h in (c.get("update") or {}).get("history", []) if isinstance(h, Mapping) and "step" in h]
        steps = max((float(h["step"]) for h in hist), default=0.0)
        for h in hist:
            b = min(int(bins * (float(h["step"]) - 1) / steps), bins - 1) if steps else 0  # steps count from 1
            for stratum in ("positive", "no_response"):
                v = h.get(f"abpo/match_rate/{stratum}")
                if v is not None and math.isfinite(float(v)):
                    acc.setdefault((c["row"], stratum, int(c["round"]), b), []).append(float(v))
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for (row, stratum, r, b), vals in sorted(acc.items()):
        xs, ys = out.setdefault(row, {}).setdefault(stratum, ([], []))
        xs.append(r - 1 + (b + 0.5) / bins)
        ys.append(float(np.mean(vals)))
    return out


def _plot_training_match(path: Path, cells: Sequence[Mapping], title: str) -> None:
    """training_match.png: training_match_curves per stratum, one line per updated row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = training_match_curves(cells)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for ax, stratum in zip(axes, ("positive", "no_response")):
        for row, by in curves.items():
            if stratum in by:
                ax.plot(*by[stratum], label=row_label(row), lw=2.2 if row == "abpo" else 1.2)
        ax.set_title(f"training-time match rate, {stratum.replace('_', '-')} exposures", fontsize=9)
        ax.set_xlabel("round (position within each round's update)")
    if curves:
        axes[0].legend(fontsize=7)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_outputs(
    exp_dir: Path,
    recs: Sequence[Mapping],
    summary: Mapping[str, Any],
    rounds_recs: Sequence[Mapping] = (),
    cells: Sequence[Mapping] = (),
) -> dict[str, Path]:
    """table.csv, table.md, ablation.png, rounds.csv, rounds.png and experiment.json in ``exp_dir`` (each written
    then renamed)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = (
        ("csv", "table.csv"),
        ("md", "table.md"),
        ("png", "ablation.png"),
        ("rounds_csv", "rounds.csv"),
        ("rounds_png", "rounds.png"),
        ("train_match_png", "training_match.png"),
        ("json", "experiment.json"),
    )
    paths = {k: exp_dir / n for k, n in names}
    tmp = {k: p.with_name(p.name + ".tmp") for k, p in paths.items()}
    for key, data in (("csv", recs), ("rounds_csv", rounds_recs)):
        keys = sorted({k for r in data for k in r}, key=lambda k: (k not in ("row", "label", "round", "seeds"), k))
        with open(tmp[key], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys or ["row"])
            w.writeheader()
            for r in data:
                w.writerow(r)
    e = summary
    ni_rel = e.get("noninferiority_relative_margin")
    note = (
        f"{e['eval_users']} {e['eval_split']} users x {e['seeds']} seeds, M = {e['eval_candidates']} candidates, "
        f"{e['rounds']} round(s); mean ± std over seeds. Comparisons: Δ = row - reference with a "
        f"{100 * (1 - e['alpha']):.0f}% "
        f"two-stage bootstrap interval (seeds, then users inside each drawn seed); p: two-sided from the same "
        f"bootstrap (percentile inversion), Holm-adjusted except the pre-registered primary contrast "
        f"{e.get('primary_contrast', 'abpo-grpo')} on HR@5 (unadjusted); McNemar / Wilcoxon over (seed, user) "
        f"pairs are extra columns of table.csv only; MDE: minimum detectable ΔHR@5 at {100 * e['power']:.0f}% "
        f"power from the two-stage SE, two-sided α = {e['alpha']}; non-inferiority to No-Update (one-sided, "
        f"α = {e.get('noninferiority_alpha', 0.025)}) with the absolute margin {e['noninferiority_margin']} HR@5"
        + (f" and the relative margin {100 * ni_rel:g}% of No-Update's HR@5" if ni_rel else "")
        + ". "
        f"Wall time {e['wall_seconds'] / 60:.1f} min." + (f" {e['regime']}" if e.get("regime") else "")
    )
    md = table_markdown(recs, title=f"{e['dataset']}: {e['name']}", note=note)
    if rounds_recs and e["rounds"] > 1:
        md += (
            "\n#### Rounds (mean ± std over seeds; match rates on each round's logged exposures)\n\n"
            + rounds_markdown(rounds_recs)
        )
    tmp["md"].write_text(md)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["label"] for r in recs]
    for ax, m in zip(axes, ("HR@5", "NDCG@5")):
        ax.bar(
            range(len(recs)),
            [r[m] for r in recs],
            yerr=[r[m + "_std"] for r in recs],
            capsize=4,
            color=[
                "#d62728" if r["row"] == "abpo" else "#1f77b4" if r["row"] not in BASELINES else "#7f7f7f" for r in recs
            ],
        )
        ax.set_xticks(range(len(recs)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{m} (mean ± std over {e['seeds']} seeds)")
    fig.tight_layout()
    fig.savefig(tmp["png"], dpi=110, format="png")
    plt.close(fig)
    _plot_rounds(tmp["rounds_png"], rounds_recs, recs)
    _plot_training_match(
        tmp["train_match_png"], cells, f"{e['dataset']}: {e['name']}" + (f" ({e['regime']})" if e.get("regime") else "")
    )
    tmp["json"].write_text(
        json.dumps({"summary": summary, "table": list(recs), "rounds": list(rounds_recs)}, indent=1, default=str)
    )
    for k in paths:
        tmp[k].replace(paths[k])
    return paths
