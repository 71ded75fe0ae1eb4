"""From per-arm-per-month counts to every number of the A/B report (docs/ABPO_SPEC.md "Metrics / Online").

Input is a small table (one row per month and arm: impressions, clicks, optionally users) plus,
when the raw log is at hand, per-user moments for the user-clustered test and the whole-period user
counts (see :func:`abpo.abtest.inputs.counts_from_warehouse`). Output is a :class:`Report`; rendering
lives in :mod:`abpo.abtest.render`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import pyarrow as pa

from abpo.abtest import stats
from abpo.months import is_month

ALL = "all"  # the period label of the whole-period aggregate

# One sentence per statistic, shown in the report next to the table it explains.
EXPLANATIONS: dict[str, str] = {
    "ctr": "CTR is clicks divided by impressions for one arm in one month; the interval is the Wilson score "
    "interval, which stays sensible at zero clicks.",
    "diff": "The difference is the candidate arm's CTR minus the other arm's (or the later month's minus the "
    "earlier month's) in percentage points, with a Wald confidence interval from the unpooled standard error.",
    "ztest": "z and p come from the two-sided two-proportion z-test with the pooled standard error, which treats "
    "every impression as an independent trial; p below 0.001 is shown as <0.001.",
    "clustered": "Because users, not impressions, are randomised and one user's impressions are correlated, the "
    "user-clustered z-test estimates the variance of each arm's CTR with the delta method over per-user "
    "click and impression totals, which is the honest (usually wider) uncertainty.",
    "holm": "Holm's step-down correction adjusts the p-values of the candidate-vs-arm comparisons within each period "
    "so that the chance of any false positive across those comparisons stays at the nominal level.",
    "srm": "The sample-ratio-mismatch check compares the users seen in each arm with the configured traffic shares "
    "by a chi-square goodness-of-fit test; p < {alpha} means assignment or logging is broken and the "
    "comparisons should not be trusted until that is explained.",
    "trend": "The trend test compares one arm with itself across months (consecutive months and first to last) "
    "with the same pooled z-test, the difference being the later month minus the earlier month; the "
    "months share users, so read it as descriptive.",
    "mde": "The minimum detectable effect (MDE) beside each comparison is the smallest true difference the same test "
    "would detect with probability {power:.0%} at this sample size: (z_(1-alpha/2) + z_power) times the test's "
    "standard error. A difference smaller than the MDE that is not significant is not evidence of no effect.",
    "holdback": "Updating vs not updating: each arm that is updated every month minus the holdback, the same "
    "starting model (pi_init) served all along and never updated, on the same users' traffic; per month "
    "and over the whole period, with the two-proportion z-test, Holm's correction across the updated "
    "arms of each period and the MDE at {power:.0%} power. A positive difference means the updates "
    "beat not updating; one inside the MDE says little either way.",
    "integrity": "Before any test, each arm of each period is checked on its users: no user may carry more than "
    "{max_user_share:.0%} of an arm's impressions (report.max_user_share; one user's impressions are not independent "
    "trials, so a z-test on them means nothing), and {assignment} A comparison that involves a flagged arm is not "
    "tested; its difference is still shown.",
    "aggregate": "The whole-period aggregate sums impressions and clicks of each arm over the selected months and "
    "repeats the comparisons on those totals.",
}


class ReportInputError(ValueError):
    """The counts handed to the report are unusable; the message says which row/field and why."""


@dataclass(frozen=True)
class Cell:
    """One arm in one period (a month, or ALL for the whole-period aggregate)."""

    period: str
    arm: str
    impressions: int
    clicks: int
    users: int | None
    ctr: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Comparison:
    """Candidate arm vs another arm in one period (difference = candidate - other)."""

    period: str
    candidate: str
    other: str
    test: stats.DiffTest
    p_holm: float
    clustered: stats.DiffTest | None
    clustered_p_holm: float
    note: str = ""
    withheld: str = ""  # why the comparison is not tested (an arm flagged by the integrity checks); "" when tested


@dataclass(frozen=True)
class Trend:
    """One arm, later month vs earlier month (difference = later - earlier)."""

    arm: str
    earlier: str
    later: str
    kind: str  # "consecutive" or "first-to-last"
    test: stats.DiffTest
    note: str = ""
    withheld: str = ""  # why it is not tested (the arm flagged in either month); "" when tested


@dataclass
class Report:
    months: list[str]
    arms: list[str]
    candidate: str
    confidence: float
    srm_alpha: float
    shares: dict[str, float]
    cells: list[Cell]  # per month and arm, months in order, candidate first
    totals: list[Cell]  # period == ALL
    comparisons: list[Comparison]  # per month, then ALL
    trends: list[Trend]
    srm: dict[str, stats.SRMResult]  # period -> result
    notes: list[str] = field(default_factory=list)
    source: str = ""
    power: float = 0.8  # of the minimum detectable effects
    holdback_arm: str = ""  # report.holdback_arm when it has data, else ""
    holdback: list[Comparison] = field(default_factory=list)  # each updated arm vs the holdback, per month, then ALL
    max_user_share: float = 1.0  # report.max_user_share
    assignment: str = ""  # how users were checked against their assignment ("" when not: CSV, external router)
    untested: dict[str, dict[str, str]] = field(default_factory=dict)  # period -> arm -> why its comparisons are not
    #                                                                   tested (integrity checks)
    flags: list[str] = field(default_factory=list)  # one line per integrity problem, for the summary

    def cell(self, period: str, arm: str) -> Cell | None:
        for c in self.totals if period == ALL else self.cells:
            if c.period == period and c.arm == arm:
                return c
        return None

    @property
    def srm_flagged(self) -> list[str]:
        return [period for period, r in self.srm.items() if r.mismatch]

    def explanations(self) -> dict[str, str]:
        assignment = (
            f"every logged user must be in the arm the experiment's salted hash assigns them ({self.assignment})."
            if self.assignment
            else "the users' assignment to arms is not checked here (see the notes)."
        )
        return {
            k: v.format(
                alpha=self.srm_alpha, power=self.power, max_user_share=self.max_user_share, assignment=assignment
            )
            for k, v in EXPLANATIONS.items()
            if k != "holdback" or self.holdback
        }  # the holdback's only with its table


def _period_str(v: Any, where: str) -> str:
    """A per-period SQL row's period: ALL (the whole period) as it is, else its month as YYYY-MM."""
    return ALL if v == ALL else _month_str(v, where)


def _month_str(v: Any, where: str) -> str:
    if hasattr(v, "strftime"):
        return v.strftime("%Y-%m")
    s = str(v)
    if not is_month(s):
        raise ReportInputError(f"{where}: month {s!r} is not YYYY-MM (ASCII digits, month 01-12, nothing after)")
    return s


@overload
def _count(v: Any, where: str, name: str, nullable: Literal[False] = False) -> int: ...
@overload
def _count(v: Any, where: str, name: str, nullable: bool) -> int | None: ...
def _count(v: Any, where: str, name: str, nullable: bool = False) -> int | None:
    if v is None:
        if nullable:
            return None
        raise ReportInputError(f"{where}: {name} is missing")
    if isinstance(v, float):
        if not v.is_integer():
            raise ReportInputError(f"{where}: {name}={v!r} is not a whole number")
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ReportInputError(f"{where}: {name}={v!r} is not a non-negative integer")
    return v


def normalise_counts(counts: pa.Table, source: str = "counts") -> list[dict[str, Any]]:
    """Rows of (month, arm, impressions, clicks, users|None), validated: clicks <= impressions,
    users <= impressions, one row per (month, arm). Errors name the row (1-based) and the rule."""
    required = {"month", "arm", "impressions", "clicks"}
    missing = required - set(counts.column_names)
    if missing:
        raise ReportInputError(f"{source}: missing column(s) {sorted(missing)}; have {counts.column_names}")
    has_users = "users" in counts.column_names
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], int] = {}  # (month, arm) -> its row
    for i, r in enumerate(counts.to_pylist(), start=1):
        where = f"{source} row {i}"
        month = _month_str(r["month"], where)
        arm = r["arm"]
        if not isinstance(arm, str) or not arm.strip():
            raise ReportInputError(f"{where}: arm {arm!r} is empty")
        imps = _count(r["impressions"], where, "impressions")
        clicks = _count(r["clicks"], where, "clicks")
        users = _count(r.get("users"), where, "users", nullable=True) if has_users else None
        if clicks > imps:
            raise ReportInputError(f"{where}: clicks={clicks} exceed impressions={imps}")
        if users is not None and users > imps:
            raise ReportInputError(f"{where}: users={users} exceed impressions={imps} (every user has >= 1 impression)")
        if (month, arm) in seen:
            raise ReportInputError(f"{where}: duplicate month/arm {month}/{arm} (first at row {seen[(month, arm)]})")
        seen[(month, arm)] = i
        rows.append({"month": month, "arm": arm.strip(), "impressions": imps, "clicks": clicks, "users": users})
    return rows


def _moments_index(moments: pa.Table | None) -> dict[tuple[str, str], stats.UserMoments]:
    """(period, arm) -> UserMoments from the table of sql/report_user_moments.sql."""
    if moments is None:
        return {}
    out = {}
    for r in moments.to_pylist():
        period = _period_str(r["period"], "user moments")
        out[(period, r["arm"])] = stats.UserMoments.from_row(r)
    return out


def _period_name(period: str) -> str:
    return "the whole period" if period == ALL else period


def integrity_checks(
    moments: pa.Table | None, assignment: pa.Table | None, max_user_share: float, assignment_rule: str
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Which arms of which periods are not fit for a test, and one flag line per problem (docs/operations.md "What
    it refuses", the report).

    - **Few users**: one user carries more than ``max_user_share`` of the arm's impressions in the period
      (``top_user_impressions`` of sql/report_user_moments.sql over its impressions). The pooled z-test treats every
      impression as an independent trial and the clustered one needs many users; one user across every arm of a
      replayed log gave z = -87.
    - **Assignment**: users whose rows are in an arm the experiment's salted hash does not give them
      (sql/report_assignment.sql): the arms are then not randomised samples of the same users.

    Returns (period -> arm -> reason, flag lines); the reasons are short clauses for a comparison's line."""
    untested: dict[str, dict[str, str]] = {}
    few: dict[str, list[str]] = {}  # arm -> ["<share> in <period> (<users> users)", ...]
    wrong: dict[str, list[str]] = {}  # arm -> ["<k> of <n> users in <period> (e.g. user <id>)", ...]

    def users(n: int) -> str:
        return f"{n:,} user{'s' * (n != 1)}"

    def flag(period: str, arm: str, why: str) -> None:
        prev = untested.setdefault(period, {}).get(arm)
        untested[period][arm] = f"{prev}, {why}" if prev else why

    if moments is not None and "top_user_impressions" in moments.column_names:
        for r in moments.to_pylist():
            imps, top = int(r["impressions"] or 0), int(r["top_user_impressions"] or 0)
            if imps <= 0 or top / imps <= max_user_share:
                continue
            period = _period_str(r["period"], "user moments")
            flag(period, r["arm"], f"one user carries {top / imps:.0%} of its impressions ({users(int(r['users']))})")
            few.setdefault(r["arm"], []).append(
                f"{top / imps:.0%} in {_period_name(period)} ({users(int(r['users']))})"
            )
    if assignment is not None:
        for r in assignment.to_pylist():
            k = int(r["misassigned_users"] or 0)
            if k == 0:
                continue
            period = _period_str(r["period"], "assignment check")
            flag(period, r["arm"], f"{k:,} of its {users(int(r['users']))} assigned to another arm")
            wrong.setdefault(r["arm"], []).append(
                f"{k:,} of {users(int(r['users']))} in {_period_name(period)} (e.g. user {r['example_user']})"
            )

    def listed(per_arm: dict[str, list[str]]) -> str:
        shown = 3  # periods named per arm; the report's tables name every one
        return "; ".join(
            f"{a}: {', '.join(v[:shown])}" + (f" and {len(v) - shown} more" if len(v) > shown else "")
            for a, v in per_arm.items()
        )

    flags = []
    if few:
        flags.append(
            f"FEW USERS: one user carries more than {max_user_share:.0%} of an arm's impressions (rule: "
            f"report.max_user_share {max_user_share:g}; one user's impressions are not independent trials): "
            f"{listed(few)}: comparisons with these arms are not tested"
        )
    if wrong:
        flags.append(
            f"ASSIGNMENT MISMATCH: users logged in an arm the experiment does not assign them ({assignment_rule}): "
            f"{listed(wrong)}: comparisons with these arms are not tested until assignment or logging is explained"
        )
    return untested, flags


def _cell(period: str, arm: str, imps: int, clicks: int, users: int | None, confidence: float) -> Cell:
    lo, hi = stats.wilson_interval(clicks, imps, confidence)
    return Cell(period, arm, imps, clicks, users, stats.ctr(clicks, imps), lo, hi)


def sample_ratio_checks(
    months: list[str], cells: list[Cell], totals: list[Cell], report_cfg, notes: list[str]
) -> tuple[dict[str, float], dict[str, stats.SRMResult]]:
    """(configured shares, period -> sample-ratio-mismatch result) of users per arm, per month and over the whole
    period (distinct users); a period without user counts gets a note in ``notes`` instead."""
    shares = dict(report_cfg.arm_shares)
    for a, v in shares.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ReportInputError(f"config report.arm_shares[{a!r}] = {v!r}: expected a number >= 0")
    srm: dict[str, stats.SRMResult] = {}
    for m in months:
        users = {c.arm: c.users for c in cells if c.period == m}
        if not users:
            continue
        counted = {a: u for a, u in users.items() if u is not None}
        if len(counted) < len(users):
            notes.append(f"{m}: no user counts: sample-ratio check not possible")
            continue
        configured_missing = sorted(set(shares) - set(counted))
        r = stats.srm_test(counted, shares, report_cfg.srm_alpha)
        if configured_missing:
            extra = (
                f"configured arm(s) {', '.join(configured_missing)} absent: shares renormalised over the arms present"
            )
            r = stats.SRMResult(**{**r.__dict__, "note": "; ".join(x for x in (r.note, extra) if x)})
        srm[m] = r
    total_users = {c.arm: c.users for c in totals}
    total_counted = {a: u for a, u in total_users.items() if u is not None}
    if total_users and len(total_counted) == len(total_users):
        srm[ALL] = stats.srm_test(total_counted, shares, report_cfg.srm_alpha)
    else:
        notes.append(
            "whole period: distinct users per arm unknown (per-month counts cannot be summed): "
            "no whole-period sample-ratio check"
        )
    return shares, srm


def _levels(report_cfg) -> tuple[float, float]:
    """(confidence, power) of the report, each checked to lie in (0, 1), and report.srm_alpha checked likewise."""
    conf = float(report_cfg.confidence)
    if not 0.0 < conf < 1.0:
        raise ReportInputError(f"config report.confidence = {report_cfg.confidence!r}: expected a level in (0, 1)")
    power = float(report_cfg.power)
    if not 0.0 < power < 1.0:
        raise ReportInputError(f"config report.power = {report_cfg.power!r}: expected a probability in (0, 1)")
    if not 0.0 < float(report_cfg.srm_alpha) < 1.0:
        raise ReportInputError(f"config report.srm_alpha = {report_cfg.srm_alpha!r}: expected a p-value in (0, 1)")
    return conf, power


def _select_months(
    rows: list[dict[str, Any]], months: list[str] | None, source: str, notes: list[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """(the report's months, the rows in them): the months asked for (default: those present), the rows of other
    months dropped with a note; a month asked for but absent gets a note; no rows left is an error."""
    present_months = sorted({r["month"] for r in rows})
    if months is None:
        months = present_months
    else:
        months = [_month_str(m, "months") for m in months]
        outside = [r for r in rows if r["month"] not in months]
        if outside:
            notes.append(
                f"{len(outside)} row(s) outside the selected months ignored "
                f"({', '.join(sorted({r['month'] for r in outside}))})"
            )
        rows = [r for r in rows if r["month"] in months]
    if not rows:
        raise ReportInputError(f"{source}: no data for the months {', '.join(months) or '(none)'}")
    for m in months:
        if m not in present_months:
            notes.append(f"{m}: no data for any arm")
    return months, rows


def _month_cells(
    months: list[str],
    arms: list[str],
    by: dict[tuple[str, str], dict[str, Any]],
    mom: dict[tuple[str, str], stats.UserMoments],
    conf: float,
    notes: list[str],
) -> list[Cell]:
    """One :class:`Cell` per arm and month with data (users from the counts, else from the user moments); an arm
    missing from a month that has data, or with zero impressions, gets a note."""
    cells = []
    for m in months:
        for a in arms:
            r = by.get((m, a))
            if r is None:
                if any(mm == m for mm, _ in by):
                    notes.append(f"{m}: arm {a!r} has no data")
                continue
            users = r["users"] if r["users"] is not None else (mom[(m, a)].users if (m, a) in mom else None)
            cells.append(_cell(m, a, r["impressions"], r["clicks"], users, conf))
            if r["impressions"] == 0:
                notes.append(f"{m}: arm {a!r} has zero impressions (CTR undefined)")
    return cells


def _whole_period_totals(
    months: list[str],
    arms: list[str],
    rows: list[dict[str, Any]],
    mom: dict[tuple[str, str], stats.UserMoments],
    conf: float,
    notes: list[str],
) -> list[Cell]:
    """One whole-period :class:`Cell` per arm (impressions and clicks summed over its months; distinct users from the
    user moments, or the month's users when there is one month); an arm not covering every month gets a note."""
    totals = []
    for a in arms:
        arm_rows = [r for r in rows if r["arm"] == a]
        covered = [r["month"] for r in arm_rows]
        if len(covered) < len(months):
            notes.append(f"aggregate of {a!r} covers {', '.join(covered)} only")
        users = mom[(ALL, a)].users if (ALL, a) in mom else None
        if users is None and len(months) == 1:  # one month: the period's distinct users are the month's
            users = arm_rows[0]["users"]
        totals.append(
            _cell(ALL, a, sum(r["impressions"] for r in arm_rows), sum(r["clicks"] for r in arm_rows), users, conf)
        )
    return totals


@dataclass(frozen=True)
class _Families:
    """The comparisons of one period as a Holm family, over the report's cells, totals and user moments."""

    cells: list[Cell]
    totals: list[Cell]
    mom: dict[tuple[str, str], stats.UserMoments]
    untested: dict[str, dict[str, str]]
    conf: float
    power: float

    def __call__(self, period: str, pairs: list[tuple[str, str]]) -> list[Comparison]:
        """(a, b) -> a minus b in ``period``, by the pooled and (with user moments) the clustered z-test, Holm's
        correction across the pairs."""
        cells, totals, mom, conf, power = self.cells, self.totals, self.mom, self.conf, self.power
        tests: list[tuple[str, str, stats.DiffTest, stats.DiffTest | None, str]] = []  # (a, b, pooled, clustered, note)
        for a, b in pairs:
            ca = next((c for c in (totals if period == ALL else cells) if c.period == period and c.arm == a), None)
            cb = next((c for c in (totals if period == ALL else cells) if c.period == period and c.arm == b), None)
            if ca is None or cb is None:
                absent = " and ".join(repr(x) for x, c in ((a, ca), (b, cb)) if c is None)
                nan = math.nan
                t = stats.DiffTest(nan, nan, nan, nan, nan, nan, nan, nan, note=f"no data for {absent} in {period}")
                tests.append((a, b, t, None, f"no data for {absent} in {period}"))
                continue
            t = stats.two_proportion_ztest(ca.clicks, ca.impressions, cb.clicks, cb.impressions, conf, power)
            ct = None
            if (period, a) in mom and (period, b) in mom:
                ct = stats.clustered_ztest(mom[(period, a)], mom[(period, b)], conf, power)
            tests.append((a, b, t, ct, t.note))
        flagged = self.untested.get(period, {})
        withheld = ["; ".join(f"{x}: {flagged[x]}" for x in (a, b) if x in flagged) for a, b, *_ in tests]
        # a comparison that is not tested takes no part in Holm's family
        holm = stats.holm_adjust([math.nan if w else t.p for (_, _, t, _, _), w in zip(tests, withheld)])
        cholm = stats.holm_adjust(
            [ct.p if ct is not None and not w else math.nan for (_, _, _, ct, _), w in zip(tests, withheld)]
        )
        return [
            Comparison(period, a, b, t, ph, ct, cph, note, w)
            for (a, b, t, ct, note), ph, cph, w in zip(tests, holm, cholm, withheld)
        ]


def _holdback_comparisons(
    report_cfg, months: list[str], arm_set: set[str], family: _Families, notes: list[str]
) -> tuple[str, list[Comparison]]:
    """(the holdback arm, its comparisons): updating vs not updating, each updated arm minus the holdback, per month
    and over the whole period; a holdback without data, or without an updated arm with data, gets a note."""
    held = str(getattr(report_cfg, "holdback_arm", "") or "")
    holdback: list[Comparison] = []
    if held and held in arm_set:
        updated = [a for a in getattr(report_cfg, "updated_arms", []) if a in arm_set and a != held]
        if updated:
            for period in [*months, ALL]:
                holdback += family(period, [(a, held) for a in updated])
        else:
            notes.append(
                f"holdback arm {held!r} has data but none of report.updated_arms "
                f"{list(getattr(report_cfg, 'updated_arms', []))} does: no updating-vs-holdback table"
            )
    elif held and held in dict(report_cfg.arm_shares):
        notes.append(
            f"holdback arm {held!r} is in report.arm_shares but has no data in the selected months: no "
            "updating-vs-holdback table"
        )
    return held, holdback


def _trends(
    months: list[str],
    arms: list[str],
    by: dict[tuple[str, str], dict[str, Any]],
    untested: dict[str, dict[str, str]],
    conf: float,
    power: float,
    notes: list[str],
) -> list[Trend]:
    """Trends of every arm: consecutive months, and first-to-last when there are more than two months (later minus
    earlier by the pooled z-test); one month gets a note instead."""
    trends: list[Trend] = []
    if len(months) < 2:
        notes.append("one month only: no month-to-month trend")
        return trends
    pairs = [(months[i], months[i + 1], "consecutive") for i in range(len(months) - 1)]
    if len(months) > 2:
        pairs.append((months[0], months[-1], "first-to-last"))
    for a in arms:
        for early, late, kind in pairs:
            ce, cl = by.get((early, a)), by.get((late, a))
            if ce is None or cl is None:
                absent = ", ".join(m for m, c in ((early, ce), (late, cl)) if c is None)
                nan = math.nan
                t = stats.DiffTest(nan, nan, nan, nan, nan, nan, nan, nan, note=f"no data for {a!r} in {absent}")
            else:
                t = stats.two_proportion_ztest(
                    cl["clicks"], cl["impressions"], ce["clicks"], ce["impressions"], conf, power
                )
            flagged = "; ".join(f"{m}: {untested[m][a]}" for m in (early, late) if a in untested.get(m, {}))
            trends.append(Trend(a, early, late, kind, t, t.note, flagged))
    return trends


def analyse(
    counts: pa.Table,
    report_cfg,
    months: list[str] | None = None,
    moments: pa.Table | None = None,
    source: str = "counts",
    assignment: pa.Table | None = None,
    assignment_rule: str = "",
) -> Report:
    """Every statistic of the report from the counts (and, optionally, the per-user moments).

    ``months``: the months asked for, in order; default = the months present in ``counts``. Rows of
    other months are ignored (a note says how many); a month asked for but absent gets a note.
    ``assignment``: sql/report_assignment.sql's rows (each arm's users not in the arm the experiment assigns them),
    checked under ``assignment_rule`` (the salt and shares, for the flag line); None: not checked.
    A comparison involving an arm that :func:`integrity_checks` flags is not tested (``Comparison.withheld``).
    """
    rows = normalise_counts(counts, source)
    candidate = report_cfg.candidate_arm
    conf, power = _levels(report_cfg)
    notes: list[str] = []
    months, rows = _select_months(rows, months, source, notes)
    by = {(r["month"], r["arm"]): r for r in rows}
    arm_set = {r["arm"] for r in rows}
    arms = ([candidate] if candidate in arm_set else []) + sorted(arm_set - {candidate})
    if candidate not in arm_set:
        notes.append(f"candidate arm {candidate!r} has no data in the selected months: no candidate comparisons")
    mom = _moments_index(moments)
    max_share = float(getattr(report_cfg, "max_user_share", 1.0))
    if not 0.0 < max_share <= 1.0:
        raise ReportInputError(f"config report.max_user_share = {max_share!r}: expected a share in (0, 1]")
    untested, flags = integrity_checks(moments, assignment, max_share, assignment_rule)
    if moments is None:
        notes.append(
            "no per-user data (CSV input): whether an arm is dominated by few users or holds users assigned to "
            "another arm cannot be checked"
        )
    cells = _month_cells(months, arms, by, mom, conf, notes)
    totals = _whole_period_totals(months, arms, rows, mom, conf, notes)
    family = _Families(cells, totals, mom, untested, conf, power)

    # candidate vs each other arm, per month and over the whole period; Holm within each period
    comparisons: list[Comparison] = []
    if candidate in arm_set:
        for period in [*months, ALL]:
            comparisons += family(period, [(candidate, other) for other in arms[1:]])
        if not any(c.clustered for c in comparisons):
            notes.append("no per-user data (CSV input or no user moments): the user-clustered test is not available")

    held, holdback = _holdback_comparisons(report_cfg, months, arm_set, family, notes)
    trends = _trends(months, arms, by, untested, conf, power, notes)
    shares, srm = sample_ratio_checks(months, cells, totals, report_cfg, notes)

    return Report(
        months=months,
        arms=arms,
        candidate=candidate,
        confidence=conf,
        power=power,
        srm_alpha=report_cfg.srm_alpha,
        shares=shares,
        cells=cells,
        totals=totals,
        comparisons=comparisons,
        trends=trends,
        srm=srm,
        notes=notes,
        source=source,
        holdback_arm=held if holdback else "",
        holdback=holdback,
        max_user_share=max_share,
        assignment=assignment_rule if assignment is not None else "",
        untested=untested,
        flags=flags,
    )
