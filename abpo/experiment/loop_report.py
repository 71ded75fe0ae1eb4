"""The replicated loop experiment's report (abpo.experiment.loop_experiment): the headline pairs, the two-stage
analysis of the replicates' per-user moments (abpo.abtest.replicated), report.md's cost line, the summary's lines,
and the design sized for a target MDE."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment.loop_fingerprints import save_json
from abpo.experiment.loop_workers import cores

if TYPE_CHECKING:
    from abpo.abtest.replicated import ReplicatedReport
    from abpo.config import Config


def headline_pairs(cfg: Config, arms: list[str]) -> list[tuple[str, str]]:
    """Each updated LLM arm minus the holdback, then the candidate minus the other updated LLM arms."""
    from abpo.arms.names import LLM, entry

    hold = cfg.report.holdback_arm if cfg.report.holdback_arm in arms else ""
    llm = [a for a in arms if entry(a).kind == LLM]
    out = [(a, hold) for a in llm] if hold else []
    cand = cfg.report.candidate_arm
    out += [(cand, a) for a in llm if a != cand and cand in llm]
    return out or [(arms[0], arms[1])]


def analyse(
    cfg: Config, ordered: list[dict[str, Any]], month_list: list[str]
) -> tuple[ReplicatedReport, list[tuple[str, str]]]:
    """(the two-stage analysis of the replicates' per-user moments, every arm pair per month and over the period
    (abpo.abtest.replicated.analyse_replicates); the headline pairs (headline_pairs))."""
    from abpo.abtest import replicated as rp
    from abpo.monthly.common import arms_of

    arms = arms_of(cfg)
    per_rep = [rp.moments_by_period(r["moments"]) for r in ordered]
    hold = cfg.report.holdback_arm if cfg.report.holdback_arm in arms else ""
    report = rp.analyse_replicates(
        per_rep,
        month_list,
        arms,
        rp.arm_pairs(arms, holdback=hold, candidate=cfg.report.candidate_arm),
        confidence=cfg.report.confidence,
        power=cfg.report.power,
    )
    return report, headline_pairs(cfg, arms)


def report_markdown(
    cfg: Config,
    report: ReplicatedReport,
    headline: list[tuple[str, str]],
    ordered: list[dict[str, Any]],
    code: str,
    *,
    replicates: int,
    months: int,
    wall: float,
    workers: int,
    ran: int,
    reused: int,
    bootstrap: dict[str, Any] | None,
    bootstrap_reused: bool,
) -> str:
    """report.md: the analysis's tables (abpo.abtest.replicated.replicated_markdown) with what the run cost above
    the headline comparisons: wall time, replicates run and reused, the shared bootstrap's and each replicate's
    seconds, and a note naming the other code that made replicates reused with --any-code (said, never hidden)."""
    from abpo.abtest import replicated as rp

    title = f"Replicated loop experiment: {cfg.name}, {replicates} replicate(s) x {months} month(s)"
    md = rp.replicated_markdown(report, headline, title=title)
    boot = "reused" if bootstrap_reused else f"{float((bootstrap or {}).get('seconds', 0)):.0f} s"
    rep_secs = ", ".join(f"{float(r['seconds']):.0f}" for r in ordered)
    other = sorted({str(r.get("code")) for r in ordered if r.get("code") != code})
    if other:
        rep_secs += (
            f" (NOTE: {sum(r.get('code') != code for r in ordered)} replicate(s) were made by other code, digest(s) "
            f"{', '.join(other)}; this code is {code})"
        )
    cost = (
        f"Wall time {wall / 60:.1f} min on {cores()} core(s) ({workers} worker(s)); "
        f"{ran} replicate(s) run now, {reused} reused; shared bootstrap {boot}; replicate wall "
        f"times {rep_secs} s."
    )
    return md.replace("\n## Headline comparisons", f"\n{cost}\n\n## Headline comparisons", 1)


def add_sizing(
    cfg: Config,
    ordered: list[dict[str, Any]],
    month_list: list[str],
    headline: list[tuple[str, str]],
    target_mde_pp: float,
    workers: int,
    bootstrap: dict[str, Any] | None,
    md: str,
    payload: dict[str, Any],
    out: Path,
) -> list[str]:
    """The design sized for a whole-period MDE of ``target_mde_pp`` (size_design) added to report.json (``sizing``)
    and report.md (its table), both rewritten; returns the summary's lines, one per headline pair for which S
    replicates of every month reach it."""
    rows = size_design(cfg, ordered, month_list, headline, target_mde_pp / 100, workers, bootstrap)
    payload["sizing"] = {"target_mde_pp": target_mde_pp, "workers": workers, "rows": rows}
    save_json(out / "report.json", payload)
    md += "\n" + "\n".join(sizing_markdown(rows, target_mde_pp, workers)) + "\n"
    (out / "report.md").write_text(md)
    return [
        f"  for an MDE of {target_mde_pp} pp on {row['a']} − {row['b']}: S = {row['replicates_needed']} "
        f"replicates of {row['months']} month(s), about {row['wall_minutes']:.0f} min on {workers} worker(s)"
        for row in rows
        if row["months"] == len(month_list) and row["replicates_needed"]
    ]


def headline_lines(report: ReplicatedReport, headline: list[tuple[str, str]]) -> list[str]:
    """The summary's line for each headline pair over the whole period: difference, interval, p and MDE in
    percentage points (n/a with the reason where it is not defined)."""
    from abpo.abtest import replicated as rp

    lines = []
    for a, b in headline:
        t = report.diffs[rp.ALL][(a, b)]
        lines.append(
            f"- {a} − {b}: {100 * t.estimate:+.3f} pp [{100 * t.ci_low:+.3f}, {100 * t.ci_high:+.3f}], "
            f"p = {t.p:.3f}, MDE {100 * t.mde:.3f} pp ({t.replicates} replicates; SE from {t.basis or 'n/a'})"
            if t.defined
            else f"- {a} − {b}: n/a ({t.note})"
        )
    return lines


def size_design(
    cfg: Config,
    results: list[dict[str, Any]],
    months: list[str],
    pairs: list[tuple[str, str]],
    target: float,
    workers: int,
    bootstrap: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The replicates S that bring each pair's whole-period MDE to ``target`` (a fraction) with the first k months,
    k = 1..N (abpo.abtest.replicated.replicates_for_mde on this run's per-replicate variance max(s²_B, v̄_W) of
    those months, read from the replicates' warehouses; k = N from the saved moments when a state is gone), and what
    that costs from scratch: the shared bootstrap's recorded seconds + ceil(S / workers) x the replicates' mean
    seconds for k months in this run."""
    from abpo.abtest import replicated as rp
    from abpo.abtest.report import load_from_warehouse

    rows: list[dict[str, Any]] = []
    boot_s = float((bootstrap or {}).get("seconds", 0) or 0)
    for k in range(1, len(months) + 1):
        per_rep = []
        for r in results:
            house = Path(r["state"]) / "warehouse.duckdb"
            if k == len(months):
                per_rep.append(rp.moments_by_period(r["moments"]))
            elif house.exists():
                per_rep.append(rp.moments_by_period(load_from_warehouse(house, months[:k])[1].to_pylist()))
        if len(per_rep) < len(results):
            continue  # a replicate's state is gone: its first k months cannot be read
        rep_s = sum(sum(float(m["seconds"]) for m in r["months"][:k]) for r in results) / len(results)
        for a, b in pairs:
            t = rp.pair_difference(per_rep, rp.ALL, a, b, cfg.report.confidence, cfg.report.power)
            var = max(t.between_var, t.within_var) if len(results) > 1 else t.within_var
            need = rp.replicates_for_mde(target, var, cfg.report.confidence, cfg.report.power)
            rows.append(
                {
                    "months": k,
                    "a": a,
                    "b": b,
                    "sd_per_replicate_pp": 100 * math.sqrt(var) if not math.isnan(var) else None,
                    "sd_between_pp": 100 * math.sqrt(t.between_var) if not math.isnan(t.between_var) else None,
                    "sd_within_pp": 100 * math.sqrt(t.within_var) if not math.isnan(t.within_var) else None,
                    "mde_now_pp": 100 * t.mde if not math.isnan(t.mde) else None,
                    "replicates_needed": need,
                    "replicate_seconds": round(rep_s, 1),
                    "wall_minutes": (boot_s + math.ceil(need / workers) * rep_s) / 60 if need else None,
                }
            )
    return rows


def sizing_markdown(rows: list[dict[str, Any]], target_pp: float, workers: int) -> list[str]:
    def f(v: Any, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    return [
        f"## Sizing: replicates for a whole-period MDE of {target_pp} pp",
        "",
        "From this run's per-replicate variance of each pair over the first k months, max(s²_B, v̄_W) (Eq. RS of "
        f"abpo.abtest.replicated); the wall time on {workers} worker(s) = the shared bootstrap's recorded time + "
        "ceil(S / workers) x the replicates' mean seconds for k months in this run.",
        "",
        "| Months | Pair | SD per replicate (pp) | SD between / within (pp) | MDE now (pp) | S needed | est. wall (min) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['months']} | {r['a']} − {r['b']} | {f(r['sd_per_replicate_pp'], '.2f')} | "
            f"{f(r['sd_between_pp'], '.2f')} / {f(r['sd_within_pp'], '.2f')} | {f(r['mde_now_pp'], '.2f')} | "
            f"{r['replicates_needed'] or 'n/a'} | {f(r['wall_minutes'], '.0f')} |"
            for r in rows
        ),
    ]
