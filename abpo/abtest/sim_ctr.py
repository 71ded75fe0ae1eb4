"""The simulator's expected CTR in the report: the climb of each arm's champion, month by month.

For a simulated month the serve step (abpo.monthly.serve, abpo.sim.expected_ctr) stores the month's figures as
``<paths.root>/sim/expected_ctr/<YYYY-MM>.json``: per arm, the expected CTR (Eq. H1 of abpo.sim.headroom: the click
model's probabilities, no click noise) of the champion that served the month, on the month's scored requests, and
its realised CTR (simulated clicks); the references on the same requests: the loop's starting model (pi_init),
oracle-greedy and the random floor. ``benchmarks/headroom.py --online-bound ARM --record`` adds
``<YYYY-MM>.online_bound.json``: the online bound (vanilla GRPO rewarded by the simulator's click probability,
trained from ARM's champion at the month's start) on the same requests.

This module reads and writes those files (each written whole: a temporary file renamed over it) and turns them into
the report's section: a table month x arm and the climb chart (``expected_ctr.png``). It never imports the
simulator: the report reads what the serve step stored. A production month (not simulated) has no file and no
section. A file that cannot be read does not fail the report: the section names it and what is wrong with it.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abpo.config import Config

SIM_DIR = "sim"  # the simulator's folder of the state (under paths.root)
FIGURES_DIR = "expected_ctr"
BOUND_SUFFIX = ".online_bound"
PNG_NAME, JSON_NAME = "expected_ctr.png", "expected_ctr.json"  # beside the report's own files
TITLE = "Simulator's expected CTR per arm and month (simulated months only)"
BOUND_HOW = "benchmarks/headroom.py --online-bound ARM --record"
EXPLAIN = (
    "Not a measurement: the simulator's expected CTR (Eq. H1 of abpo.sim.headroom: each candidate's click "
    "probability under the simulated users' ground truth, averaged over the exposure distribution of the champion "
    "that served the month, without click noise), on {scored}. Every arm and reference is scored on the same "
    "requests, whichever arm's users made them; 'own users' is the same figure on the requests of the arm's own "
    "users among them. Realised CTR is the measured CTR of the month's simulated clicks (the table above). "
    "References: pi_init (the model the loop started from), the online bound (vanilla GRPO trained from the arm's "
    "champion at the month's start with the simulator's click probability as reward: {bound}), oracle-greedy "
    "(each request's best candidate under the click model: no ranker of these candidates does better) and a "
    "uniformly random candidate."
)


NUMBER = (int, float)


class SimCtrFileError(ValueError):
    """A stored figures file that cannot be used (unreadable, not JSON, a field missing or of the wrong kind)."""


def figures_dir(cfg: Config) -> Path:
    return cfg.paths.resolve("root") / SIM_DIR / FIGURES_DIR


def figures_path(cfg: Config, month: str) -> Path:
    """The serve step's figures of ``month``: ``<paths.root>/sim/expected_ctr/<month>.json``."""
    return figures_dir(cfg) / f"{month}.json"


def bound_path(cfg: Config, month: str) -> Path:
    """The online bound of ``month`` (benchmarks/headroom.py --record): ``<month>.online_bound.json`` beside it."""
    return figures_dir(cfg) / f"{month}{BOUND_SUFFIX}.json"


def write_json(path: Path, obj: dict[str, Any]) -> Path:
    """``obj`` as JSON in ``path`` (keys sorted, no NaN), written whole: a temporary file beside it renamed over
    it, so a reader never sees half a file and a rerun that computes the same figures writes the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_month_figures(cfg: Config, month: str, figures: dict[str, Any]) -> Path:
    """Store the serve step's figures of ``month`` (checked as the report reads them)."""
    check_figures(figures, figures_path(cfg, month))
    return write_json(figures_path(cfg, month), figures)


def read_month_figures(cfg: Config, month: str) -> dict[str, Any] | None:
    """The stored figures of ``month``, or None when the month has none (not simulated: production); a file that
    cannot be used raises SimCtrFileError naming it and the field."""
    path = figures_path(cfg, month)
    if not path.is_file():
        return None
    return check_figures(_load(path), path)


def write_online_bound(cfg: Config, month: str, bound: dict[str, Any]) -> Path:
    """Store the online bound of ``month`` beside its figures. Refused (ValueError naming the file and the rule)
    when the month has no figures (not served by the simulator in this state) or when the bound was computed on
    other requests than those the month served (``requests_sha256`` differs: another config or other overrides)."""
    figures = read_month_figures(cfg, month)
    if figures is None:
        raise ValueError(
            f"{figures_path(cfg, month)}: no expected-CTR figures of month {month}; rule: the online bound is recorded "
            "only for a month the serve step simulated in this state (paths.root)"
        )
    want = figures["requests"]["sha256"]
    if bound.get("requests_sha256") != want:
        raise ValueError(
            f"{figures_path(cfg, month)}: requests.sha256 {want[:12]}..., the bound's requests "
            f"{str(bound.get('requests_sha256'))[:12]}...; rule: the bound is recorded on the requests the month "
            "served (the run's config, no sim.* override)"
        )
    check_bound(bound, bound_path(cfg, month))
    return write_json(bound_path(cfg, month), bound)


def _load(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SimCtrFileError(f"{path}: not readable as JSON ({e})") from e
    if not isinstance(obj, dict):
        raise SimCtrFileError(f"{path}: a {type(obj).__name__}; rule: a JSON object")
    return obj


def _field(obj: dict[str, Any], path: Path, name: str, kind: type | tuple[type, ...], *, none: bool = False) -> Any:
    keys = name.split(".")
    v: Any = obj
    for k in keys:
        if not isinstance(v, dict) or k not in v:
            raise SimCtrFileError(f"{path}: field {name} missing")
        v = v[k]
    if v is None and none:
        return v
    if not isinstance(v, kind) or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
        raise SimCtrFileError(f"{path}: field {name} = {v!r}; rule: {_kind_name(kind)}{' or null' if none else ''}")
    return v


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == NUMBER:
        return "a number"
    names = {"int": "an integer", "float": "a number", "str": "a string", "dict": "an object"}
    return " or ".join(names[k.__name__] for k in (kind if isinstance(kind, tuple) else (kind,)))


def check_figures(obj: dict[str, Any], path: Path) -> dict[str, Any]:
    """``obj`` when it has every field the report reads, of the right kind; else SimCtrFileError naming ``path`` and
    the field."""
    _field(obj, path, "month", str)
    for name in ("requests.month", "requests.scored"):
        _field(obj, path, name, int)
    _field(obj, path, "requests.sample", str)
    _field(obj, path, "requests.sha256", str)
    _field(obj, path, "exposure_tau", NUMBER)
    for name in ("reference.oracle_greedy", "reference.random_floor"):
        _field(obj, path, name, NUMBER)
    if _field(obj, path, "reference.start", dict, none=True) is not None:
        _field(obj, path, "reference.start.model", str)
        _field(obj, path, "reference.start.expected_ctr", NUMBER)
    arms = _field(obj, path, "arms", dict)
    if not arms:
        raise SimCtrFileError(f"{path}: field arms is empty; rule: every arm that served the month")
    for arm in arms:
        _field(obj, path, f"arms.{arm}.model", str)
        _field(obj, path, f"arms.{arm}.expected_ctr", NUMBER)
        _field(obj, path, f"arms.{arm}.expected_ctr_own", NUMBER, none=True)
        _field(obj, path, f"arms.{arm}.impressions", int)
        _field(obj, path, f"arms.{arm}.realised_ctr", NUMBER, none=True)
    return obj


def check_bound(obj: dict[str, Any], path: Path) -> dict[str, Any]:
    """The online bound's fields the report reads (SimCtrFileError naming ``path`` and the field)."""
    _field(obj, path, "arm", str)
    _field(obj, path, "parent_version", str)
    _field(obj, path, "requests_sha256", str)
    _field(obj, path, "online_bound", NUMBER)
    _field(obj, path, "logged_update", NUMBER)
    return obj


@dataclass
class SimMonth:
    month: str
    figures: dict[str, Any]
    bound: dict[str, Any] | None = None


@dataclass
class SimCtr:
    """The section's months (those with figures, in order) and what could not be shown, and why."""

    months: list[SimMonth]
    notes: list[str] = field(default_factory=list)

    @property
    def arms(self) -> list[str]:
        out: list[str] = []
        for m in self.months:
            out += [a for a in m.figures["arms"] if a not in out]
        return out

    def scored(self) -> str:
        """What was scored, in words (the section's explanation and the chart's title)."""
        rules = sorted({m.figures["requests"]["sample"] for m in self.months})
        n = ", ".join(
            f"{m.figures['requests']['scored']:,} of {m.figures['requests']['month']:,} in {m.month}"
            for m in self.months
        )
        return f"a fixed, seeded sample of each month's served requests ({'; '.join(rules)}: {n})"

    def to_json(self) -> dict[str, Any]:
        return {
            "months": [{"month": m.month, "figures": m.figures, "online_bound": m.bound} for m in self.months],
            "notes": self.notes,
        }


def load_sim_ctr(cfg: Config, months: list[str]) -> SimCtr | None:
    """The stored figures of ``months`` (those the simulator served), or None when none has any (production, or a
    state from before the figures were stored): then the report has no such section. A figures or bound file that
    cannot be used leaves its month (or its bound) out and says so in the section's notes."""
    out: list[SimMonth] = []
    notes: list[str] = []
    for month in months:
        try:
            figures = read_month_figures(cfg, month)
        except SimCtrFileError as e:
            notes.append(f"{month} left out: {e}")
            continue
        if figures is None:
            continue
        sm = SimMonth(month, figures)
        path = bound_path(cfg, month)
        if path.is_file():
            try:
                bound = check_bound(_load(path), path)
                if bound["requests_sha256"] != figures["requests"]["sha256"]:
                    raise SimCtrFileError(
                        f"{path}: requests_sha256 differs from {figures_path(cfg, month)}'s; rule: the bound on the "
                        "requests the month served"
                    )
                sm.bound = bound
            except SimCtrFileError as e:
                notes.append(f"{month}: online bound not shown: {e}")
        out.append(sm)
    if not out and not notes:
        return None
    missing = [m.month for m in out if m.bound is None]
    if missing:
        notes.append(f"online bound not computed for {', '.join(missing)} (it is: {BOUND_HOW}, after the month)")
    return SimCtr(out, notes)


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def pp(v: float | None, ref: float | None) -> str:
    return "n/a" if v is None or ref is None else f"{100 * (v - ref):+.2f}"


HEADERS = [
    "Month",
    "Arm",
    "Model",
    "Expected CTR (simulator)",
    "− pi_init (pp)",
    "Expected CTR, own users (simulator)",
    "Realised CTR (simulated clicks)",
    "Impressions",
]
TEXT_HEADERS = {"Month", "Arm", "Model"}


def table_rows(sim: SimCtr) -> list[list[str]]:
    """One row per month and arm, then the month's reference rows, in :data:`HEADERS` order."""
    rows = []
    for m in sim.months:
        f = m.figures
        start = f["reference"]["start"]
        base = None if start is None else start["expected_ctr"]
        for arm, a in f["arms"].items():
            rows.append(
                [
                    m.month,
                    arm,
                    a["model"],
                    pct(a["expected_ctr"]),
                    pp(a["expected_ctr"], base),
                    pct(a["expected_ctr_own"]),
                    pct(a["realised_ctr"]),
                    f"{a['impressions']:,}",
                ]
            )
        if start is not None:
            rows.append([m.month, "reference: pi_init", start["model"], pct(base), "+0.00", "n/a", "n/a", "n/a"])
        if m.bound is not None:
            b = m.bound
            rows.append(
                [
                    m.month,
                    "reference: online bound",
                    f"grpo with the simulator's reward, from {b['arm']} v{b['parent_version']}",
                    pct(b["online_bound"]),
                    pp(b["online_bound"], base),
                    "n/a",
                    "n/a",
                    "n/a",
                ]
            )
            rows.append(
                [
                    m.month,
                    f"reference: {b['arm']} update, logged reward",
                    f"from {b['arm']} v{b['parent_version']}, same rows",
                    pct(b["logged_update"]),
                    pp(b["logged_update"], base),
                    "n/a",
                    "n/a",
                    "n/a",
                ]
            )
        else:
            rows.append(
                [m.month, "reference: online bound", f"not computed ({BOUND_HOW})", "n/a", "n/a", "n/a", "n/a", "n/a"]
            )
        ref = f["reference"]
        rows.append(
            [
                m.month,
                "reference: oracle-greedy",
                "best candidate",
                pct(ref["oracle_greedy"]),
                pp(ref["oracle_greedy"], base),
            ]
            + ["n/a"] * 3
        )
        rows.append(
            [m.month, "reference: random candidate", "uniform", pct(ref["random_floor"]), pp(ref["random_floor"], base)]
            + ["n/a"] * 3
        )
    return rows


def explanation(sim: SimCtr) -> str:
    done = [m.month for m in sim.months if m.bound is not None]
    bound = f"recorded for {', '.join(done)}" if done else f"not computed: {BOUND_HOW}"
    return EXPLAIN.format(scored=sim.scored(), bound=bound)


def plot_png(sim: SimCtr) -> bytes:
    """The climb chart: each arm's expected CTR (%) month by month with pi_init and the online bound as reference
    lines (top), and the same arms against oracle-greedy and the random floor (bottom, the whole headroom).
    Deterministic: the same figures give the same bytes (no metadata but the image)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    months = [m.month for m in sim.months]
    x = list(range(len(months)))

    def series(get) -> list[float]:
        out = []
        for m in sim.months:
            v = get(m)
            out.append(math.nan if v is None else 100 * float(v))
        return out

    start = series(lambda m: (m.figures["reference"]["start"] or {}).get("expected_ctr"))
    bound = series(lambda m: m.bound["online_bound"] if m.bound else None)
    oracle = series(lambda m: m.figures["reference"]["oracle_greedy"])
    floor = series(lambda m: m.figures["reference"]["random_floor"])
    arms = {a: series(lambda m, a=a: (m.figures["arms"].get(a) or {}).get("expected_ctr")) for a in sim.arms}

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), dpi=100, sharex=True, height_ratios=[3, 2])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (arm, y) in enumerate(arms.items()):
        for ax in (top, bottom):
            ax.plot(x, y, marker="o", color=colours[k % len(colours)], label=arm, linewidth=1.8 if ax is top else 1.0)
    for ax in (top, bottom):
        ax.plot(x, start, color="black", linestyle="--", marker="_", markersize=14, label="pi_init")
    if not all(math.isnan(v) for v in bound):
        top.plot(x, bound, color="crimson", linestyle=":", marker="v", label="online bound (sim reward)")
    bottom.plot(x, oracle, color="dimgray", linestyle="-.", marker="^", label="oracle-greedy")
    bottom.plot(x, floor, color="silver", linestyle=":", marker=".", label="random candidate")
    top.set_title("Simulator's expected CTR of each month's champion (Eq. H1, no click noise)", fontsize="medium")
    bottom.set_title("The same against oracle-greedy and a random candidate", fontsize="medium")
    for ax in (top, bottom):
        ax.set_ylabel("expected CTR (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    bottom.set_xticks(x, months)
    bottom.set_xlim(-0.5, len(months) - 0.5)
    scored = {m.figures["requests"]["sample"] for m in sim.months}
    fig.text(0.01, 0.005, f"scored: {'; '.join(sorted(scored))}, the same requests for every line", fontsize="x-small")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
