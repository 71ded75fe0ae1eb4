"""The gate against the climb: does the monthly gate let through the challengers the simulator's
expected CTR ranks above their champion, and when it refuses one, which half refused it?

For every gate a run recorded (``<paths.root>/cycle/<YYYY-MM>.<arm>.gate.json``: month m, an updated LLM arm, its
challenger trained on month m's logs and the champion it was gated against), both versions are scored on the month
the challenger would serve, m + 1, by the simulator's expected CTR (Eq. H1 of abpo.sim.headroom: the click model's
probabilities, no click noise) on the requests the serve step scores (abpo.sim.expected_ctr.scored_sample: one
request per user) with the month's own calibration (its intercept fitted on every candidate of the month's
requests, as abpo.sim.simulator.simulate_month fits it). The table, per gate:

    month  arm  challenger  champion  E[CTR] challenger - champion (pp)  offline half  off-policy half  verdict

and the count the issue asks for: of the challengers the expected CTR ranks higher, how many the gate refused, and
how many of those each half refused (the offline paired HR@5 non-inferiority test; the off-policy SNDR comparison);
of those it ranks lower, how many the gate let through. The gate is not loosened here: this only counts what it
costs. The expected CTR is the simulator's diagnostic and never reaches the gate.

Each half's verdict comes from the gate record's ``offline_passed`` / ``ope_passed`` (abpo.monthly.gate.GateResult);
a record written before those fields gives the offline half from its paired test (``offline.passed``) and the
off-policy half recomputed by the gate's own rule (abpo.monthly.gate_verdict.ope_verdict) on the recorded numbers
with the config's margins. A gate recorded as skipped (abpo.monthly.completed: no challenger) is named and not
counted.

    .venv/bin/python benchmarks/gate_refusals.py [--config demo] [--set key=value ...] [--json out.json]
                                                 [--smoke [--state DIR]]

Run after `make demo` (or on any state: ``ABPO_STATE`` or ``--set paths.root=...``). ``--smoke`` runs the same path
in seconds (tests/benchmarks/test_smoke.py) without `make demo`: in a throw-away state (kept in ``--state DIR`` when
given, for a test to check) at benchmarks/headroom.py's smoke sizes, the first month runs whole (bootstrap, serve,
the LLM arms' updates of 4 steps, gates, promotions), then its gates are scored (the figures mean nothing at that
size). Before the wall time it counts the gates beyond +-0.5 points of expected CTR (`Beyond 0.5 points: <k> of <n>
challenger(s) ranked higher passed; <j> of <l> ranked lower refused`); the last line is exactly
`Gate refusals: <k> of <n> challenger(s) ranked higher by expected CTR refused (offline half <a>, off-policy half
<b>); <j> of <l> ranked lower passed`.

Why a script here and not an `abpo` subcommand: like benchmarks/headroom.py it reads the simulator's ground truth,
which the import-linter contract keeps out of `abpo.commands`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, also when a test loads this file by path

from headroom import SMOKE as HEADROOM_SMOKE  # noqa: E402  (benchmarks/ is on the path just above)

# --smoke: headroom.py's throw-away tiny state, with clicks likely enough for both strata in its month
SMOKE = [*HEADROOM_SMOKE, "sim.base_ctr=0.4"]


@dataclass
class GateRow:
    month: str  # the month whose logs trained the challenger (its gate's month)
    arm: str
    challenger: str
    champion: str
    scored_month: str  # the month the challenger would serve: month + 1
    challenger_ctr: float  # Eq. H1 on scored_month's scored requests
    champion_ctr: float
    offline_passed: bool
    ope_passed: bool | None  # None: the off-policy half did not run
    passed: bool

    @property
    def diff_pp(self) -> float:
        return 100 * (self.challenger_ctr - self.champion_ctr)

    @property
    def ranked_higher(self) -> bool:
        return self.challenger_ctr > self.champion_ctr


def gate_months(cfg) -> list[str]:
    """The months with at least one gate record in the state, in order."""
    d = cfg.paths.resolve("root") / "cycle"
    return sorted({p.name.split(".")[0] for p in d.glob("*.gate.json")}) if d.is_dir() else []


def halves(cfg, rec: dict, path: Path) -> tuple[bool, bool | None]:
    """(offline half passed, off-policy half passed or None when it did not run) of a gate record (module
    docstring). A record without the paired test's verdict is refused naming the file."""
    from abpo.monthly.gate_verdict import ope_verdict

    offline = rec.get("offline_passed")
    if offline is None:
        if not isinstance(rec.get("offline"), dict) or "passed" not in rec["offline"]:
            raise ValueError(f"{path}: no field offline_passed nor offline.passed; rule: a gate record of abpo")
        offline = bool(rec["offline"]["passed"])
    if rec.get("off_policy") is None:
        return bool(offline), None
    ope = rec.get("ope_passed")
    if ope is None:
        ope, _ = ope_verdict(
            rec["off_policy"],
            cfg.arms.gate_ope_margin,
            cfg.arms.gate_min_ess,
            cfg.arms.gate_max_top_weight_share,
        )
    return bool(offline), bool(ope)


def summary_line(rows: list[GateRow]) -> str:
    up = [r for r in rows if r.ranked_higher]
    down = [r for r in rows if not r.ranked_higher]
    refused = [r for r in up if not r.passed]
    return (
        f"Gate refusals: {len(refused)} of {len(up)} challenger(s) ranked higher by expected CTR refused "
        f"(offline half {sum(not r.offline_passed for r in refused)}, off-policy half "
        f"{sum(r.ope_passed is False for r in refused)}); {sum(r.passed for r in down)} of {len(down)} ranked "
        "lower passed"
    )


CLEAR_PP = 0.5  # the gate's promise: a challenger this much better passes, this much worse is refused


def clear_line(rows: list[GateRow], clear_pp: float = CLEAR_PP) -> str:
    """The count beyond +-``clear_pp`` points of expected CTR: of the challengers ranked higher by at least that,
    how many passed; of those ranked lower by at least that, how many were refused (inside it the gate at margin
    arms.gate_ope_margin promises nothing)."""
    up = [r for r in rows if r.diff_pp >= clear_pp]
    down = [r for r in rows if r.diff_pp <= -clear_pp]
    return (
        f"Beyond {clear_pp:g} points: {sum(r.passed for r in up)} of {len(up)} challenger(s) ranked higher passed; "
        f"{sum(not r.passed for r in down)} of {len(down)} ranked lower refused"
    )


def markdown(rows: list[GateRow]) -> str:
    def half(v: bool | None) -> str:
        return "not run" if v is None else ("pass" if v else "**refused**")

    out = [
        "| gate month | arm | challenger vs champion | scored on | E[CTR] challenger % | champion % | diff pp "
        "| offline half | off-policy half | verdict |",
        "|---|---|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.month} | {r.arm} | v{r.challenger} vs v{r.champion} | {r.scored_month} | "
            f"{100 * r.challenger_ctr:.2f} | {100 * r.champion_ctr:.2f} | {r.diff_pp:+.2f} | "
            f"{half(r.offline_passed)} | {half(r.ope_passed)} | {'passed' if r.passed else 'refused'} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset whose state holds the run (default demo)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--json", default="", help="also write the rows as JSON to this file")
    ap.add_argument(
        "--smoke", action="store_true", help="run the first month in a throw-away tiny state first (seconds)"
    )
    ap.add_argument("--state", default="", help="--smoke: build the state in this directory and keep it")
    args = ap.parse_args(argv)
    if args.state and not args.smoke:
        ap.error("--state names the --smoke state's directory; without --smoke name the state by --set paths.root")

    from abpo import registry
    from abpo.arms import versions
    from abpo.arms.names import LLM, entry
    from abpo.config import load_config
    from abpo.monthly.common import arms_of, dataset_and_splits
    from abpo.monthly.completed import record_path
    from abpo.months import Month
    from abpo.sim.expected_ctr import sample_scores
    from abpo.sim.headroom import candidate_click_probabilities
    from abpo.sim.simulator import month_requests

    t0 = time.perf_counter()
    state = ""
    if args.smoke:
        import tempfile

        from abpo.logs import quiet
        from abpo.monthly.month import run_month

        state = args.state or tempfile.mkdtemp(prefix="abpo-bench-gate-refusals-")
        cfg = load_config(args.config, [*SMOKE, f"paths.root={state}", *args.set])
        with quiet():
            run_month(cfg, cfg.sim.start_month)
        print(
            f"--smoke: month {cfg.sim.start_month} run whole in {state}"
            + ("" if args.state else " (removed at the end)")
        )
    else:
        cfg = load_config(args.config, args.set)
    registry.configure(cfg)
    months = gate_months(cfg)
    if not months:
        raise SystemExit(
            f"{cfg.paths.resolve('root') / 'cycle'}: no gate record (*.gate.json); rule: run months first (make demo)"
        )
    ds, splits = dataset_and_splits(cfg)
    llm = [a for a in arms_of(cfg) if entry(a).kind == LLM]
    print(f"gate refusals of config {cfg.name} in {cfg.paths.resolve('root')}: gates of {months}, arms {llm}")
    loaded: dict[tuple[str, str], object] = {}

    def policy(arm: str, v: str):
        if (arm, v) not in loaded:
            loaded[(arm, v)] = versions.load_arm(cfg, arm, ds, v)  # LookupError naming a version the store lacks
        return loaded[(arm, v)]

    rows: list[GateRow] = []
    for month in months:
        nxt = str(Month(month).plus(1))
        requests = month_requests(cfg, ds, splits, nxt)
        _, intercept = candidate_click_probabilities(cfg, ds, requests)  # the month's calibration (module docstring)
        for arm in llm:
            path = record_path(cfg, month, arm, "gate")
            if not path.is_file():
                continue
            kept = json.loads(path.read_text())  # {"result": ...} or {"skipped": why} (abpo.monthly.completed)
            if "skipped" in kept:
                print(f"  {month} {arm:<8} gate skipped ({kept['skipped']}): no challenger, not counted")
                continue
            if "result" not in kept:
                raise ValueError(f"{path}: neither result nor skipped; rule: a step record of abpo.monthly.completed")
            rec = kept["result"]
            offline, ope = halves(cfg, rec, path)
            ch, champ = str(rec["version"]), str(rec["champion_version"])
            scores = sample_scores(
                cfg,
                nxt,
                requests,
                {"challenger": policy(arm, ch), "champion": policy(arm, champ)},
                dataset=ds,
                intercept=intercept,
            )
            rows.append(
                GateRow(
                    month,
                    arm,
                    ch,
                    champ,
                    nxt,
                    scores["challenger"],
                    scores["champion"],
                    offline,
                    ope,
                    bool(rec["passed"]),
                )
            )
            r = rows[-1]
            print(
                f"  {month} {arm:<8} v{ch} vs v{champ}: {r.diff_pp:+.2f} pp on {nxt}, "
                f"{'passed' if r.passed else 'refused'} ({time.perf_counter() - t0:.0f}s)"
            )
    print("\n" + markdown(rows) + "\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": cfg.name,
                    "overrides": list(args.set),
                    "rows": [{**asdict(r), "diff_pp": r.diff_pp} for r in rows],
                    "summary": summary_line(rows),
                    "clear": clear_line(rows),
                },
                indent=1,
            )
        )
    if args.smoke and not args.state:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    print(clear_line(rows))
    print(f"wall time {time.perf_counter() - t0:.0f}s")
    print(summary_line(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
