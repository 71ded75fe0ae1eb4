"""`abpo experiment --split validation --sweep key=v1,v2 ...`: settings chosen on the validation users only.

Every ``--sweep`` names a config key and the values to try; the probes are the grid of all of them (run several
sweeps for one-at-a-time variations). Each probe is a whole experiment (abpo.experiment.runner) with the probe's
overrides, kept under ``<root>/experiments/<experiment.name>-sweep/<probe>/`` and logged to MLflow as its own
parent run tagged ``abpo.sweep`` and ``abpo.probe``. Cells are content-addressed, so a row a probe's keys do not
touch (No-Update under an update setting, the baselines) is computed once for the whole sweep, and a rerun
recomputes nothing.

A sweep refuses to run on the test users (``experiment.eval_split`` must be validation): nothing is chosen on test
targets. The summary (sweep.md, sweep.csv) has one line per probe and row: HR@5 and NDCG@5 (mean ± std over seeds),
ΔHR@5 against No-Update and against vanilla GRPO with the paired p and the bootstrap interval.
"""

from __future__ import annotations

import csv
import itertools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import UsageError
from abpo.experiment.regime_settings import describe
from abpo.experiment.runner import run_experiment
from abpo.experiment.seeds import experiments_root

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


def parse_sweep(specs: Sequence[str], option: str = "--sweep") -> list[tuple[str, list[str]]]:
    """``key=v1,v2`` specs (the values of ``option``) -> [(key, [v1, v2])]; each error (a UsageError) names the option,
    the spec and the rule."""
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", key) or not vals:
            raise UsageError(
                f"{option} {spec!r}; rule: section.key=value1,value2,... (e.g. update.learning_rate=1e-4,5e-4)"
            )
        if key.startswith("experiment.") and key.split(".", 1)[1] in ("name", "eval_split", "seeds", "rows"):
            raise UsageError(f"{option} {spec!r}; rule: {key} is the sweep's frame, not a setting to sweep")
        if any(k == key for k, _ in axes):
            raise UsageError(f"{option} {spec!r}; rule: each key once (give all its values in one {option})")
        axes.append((key, vals))
    if not axes:
        raise UsageError(f"{option}: rule: at least one key=values")
    return axes


def probes(axes: Sequence[tuple[str, Sequence[str]]]) -> list[list[str]]:
    """The grid of the axes' values, each probe as a list of ``key=value`` overrides."""
    keys = [k for k, _ in axes]
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*(vals for _, vals in axes))]


def probe_name(overrides: Sequence[str]) -> str:
    """A probe's directory name: its overrides, section prefixes dropped, made filesystem-safe."""
    parts = [o.split(".", 1)[1] if "." in o.split("=", 1)[0] else o for o in overrides]
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(parts))


@dataclass
class SweepResult:
    sweep_dir: Path
    lines: list[dict[str, Any]]
    outputs: dict[str, Path]


def _fmt(v: float | None, digits: int = 4, sign: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def _diff(r: dict[str, Any], ref: str) -> str:
    """ΔHR@5 against a reference row with its interval and p, or '-': the probe table's Holm-adjusted two-stage
    bootstrap p (abpo.experiment.table.table_rows), the unadjusted one for the primary contrast, or, for results
    written before the two-stage bootstrap, McNemar's."""
    d = r.get(f"vs_{ref}_dHR@5")
    if d is None:
        return "-"
    p = next(r[k] for k in (f"vs_{ref}_p_holm_HR@5", f"vs_{ref}_p_HR@5", f"vs_{ref}_p_mcnemar_HR@5") if k in r)
    return (
        f"{d:+.4f} [{r[f'vs_{ref}_ci_low_HR@5']:+.4f}, {r[f'vs_{ref}_ci_high_HR@5']:+.4f}] "
        f"({'<0.001' if p < 0.001 else f'{p:.3f}'})"
    )


def sweep_markdown(lines: Sequence[dict[str, Any]], title: str) -> str:
    head = [
        "Probe",
        "Row",
        "HR@5",
        "NDCG@5",
        "ΔHR@5 vs A [95% CI] (p Holm)",
        "ΔHR@5 vs B [95% CI] (p Holm)",
        "MDE vs A",
    ]
    out = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in lines:
        out.append(
            "| "
            + " | ".join(
                [
                    r["probe"],
                    r["label"],
                    f"{r['HR@5']:.4f} ± {r['HR@5_std']:.4f}",
                    f"{r['NDCG@5']:.4f} ± {r['NDCG@5_std']:.4f}",
                    _diff(r, "none"),
                    _diff(r, "grpo"),
                    _fmt(r.get("vs_none_mde_HR@5")),
                ]
            )
            + " |"
        )
    return "\n".join(out) + "\n"


def run_sweep(
    cfg: Config,
    axes: Sequence[tuple[str, Sequence[str]]],
    *,
    config_for: Callable[[list[str]], Any],
    config_ref: str = "tiny",
    overrides: Sequence[str] = (),
) -> SweepResult:
    """Run every probe of the grid (module docstring) on the validation users and write the summary.
    ``config_for(overrides)`` makes a probe's config (the command passes the preset's loader: this package sits
    below abpo.config and does not import it)."""

    if cfg.experiment.eval_split != "validation":
        raise ValueError(
            f"--sweep with experiment.eval_split={cfg.experiment.eval_split!r}; rule: a sweep runs on "
            "the validation users only (--split validation): nothing is chosen on test targets"
        )
    base = cfg.experiment.name
    sweep_dir = experiments_root(cfg) / f"{base}-sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    grid = probes(axes)
    log.info(f"sweep {base}: {len(grid)} probe(s) over {', '.join(k for k, _ in axes)} on the validation users")
    lines: list[dict[str, Any]] = []
    regimes: dict[str, str] = {}  # the logs' regime of each probe, named under the summary table
    for i, probe in enumerate(grid, 1):
        name = probe_name(probe)
        ov = [*overrides, *probe, f"experiment.name={base}-sweep/{name}"]
        pcfg = config_for(ov)
        regimes[name] = describe(pcfg)
        log.info(f"sweep {base}: probe {i}/{len(grid)} {name}")
        res = run_experiment(
            pcfg, config_ref=config_ref, overrides=ov, mlflow_tags={"abpo.sweep": base, "abpo.probe": name}
        )
        for rec in res.table:
            lines.append({"probe": name, **{k: v for k, v in rec.items()}})
    paths = {"md": sweep_dir / "sweep.md", "csv": sweep_dir / "sweep.csv"}
    md = sweep_markdown(lines, f"sweep {base} ({cfg.experiment.eval_split} users)")
    if len(set(regimes.values())) == 1:
        md += "\n" + next(iter(regimes.values())) + "\n"
    else:
        md += "\n" + "\n".join(f"- {name}: {line}" for name, line in regimes.items()) + "\n"
    paths["md"].write_text(md)
    keys = sorted({k for r in lines for k in r}, key=lambda k: (k not in ("probe", "row", "label"), k))
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(lines)
    return SweepResult(sweep_dir, lines, paths)
