"""abpo's gate decision as a pure function (gate_verdict): the offline half's paired non-inferiority test on
constructed per-user ranks (wins, losses and ties of 400 users) through the gate's own code path, every non-finite
input failing closed, and the off-policy half at, just inside and just outside its bound. No registry and no MLflow:
the numbers in, the verdict out."""

from __future__ import annotations

import math

import pytest

from abpo.monthly.gate import GateResult, offline_tags
from abpo.monthly.gate_verdict import gate_verdict

NAN, INF = math.nan, math.inf


def _ope(**kw) -> dict:
    ope = {
        "n": 400,
        "challenger_snips": 0.21,
        "champion_snips": 0.20,
        "diff": 0.01,
        "ci_low": -0.02,
        "ci_high": 0.04,
        "confidence": 0.95,
        "challenger_ess": 300.0,
        "champion_ess": 400.0,
    }
    ope.update(kw)
    return ope


def _ranks(n: int = 400, wins: int = 0, losses: int = 0, both: int = 120) -> tuple[list[int], list[int]]:
    """(challenger, champion) target ranks of n users: ``wins`` users only the challenger ranks in the top 5 (rank 3
    against 9), ``losses`` only the champion, ``both`` both (ranks 1 and 2), the rest neither (ranks 40 and 50)."""
    rest = n - wins - losses - both
    return ([3] * wins + [9] * losses + [1] * both + [40] * rest, [9] * wins + [3] * losses + [2] * both + [50] * rest)


def _verdict(
    wins: int = 0,
    losses: int = 0,
    margin: float = 0.02,
    ope: dict | None = None,
    ope_margin: float = 0.05,
    min_ess: float = 10.0,
    n: int = 400,
    metric: str = "HR@5",
):
    new, old = _ranks(n, wins, losses)
    return gate_verdict(
        metric=metric,
        challenger_ranks=new,
        champion_ranks=old,
        margin=margin,
        alpha=0.025,
        power=0.8,
        challenger_version="3",
        champion_version="2",
        ope=ope,
        ope_margin=ope_margin,
        min_ess=min_ess,
        month="2026-02",
    )


@pytest.mark.parametrize(
    ("wins", "losses", "margin", "passed"),
    [
        (0, 0, 0.02, True),  # 400 ties pass (Tango Z 2.86: under the margin about 8 would have lost)
        (0, 2, 0.02, True),  # a challenger losing 2 of 400 users, none won: within the 2-point margin (p 0.016)
        (0, 3, 0.02, False),  # 3 of 400 lost: Tango p 0.037 (the Wald test passed it, docs/gate.md)
        (0, 30, 0.02, False),  # losing 30 of 400 fails
        (40, 43, 0.02, False),  # the same net loss of 3 among many discordant users: too uncertain to pass
        (40, 0, -0.05, True),  # a negative margin demands an improvement: diff +0.10, bound +0.071 > +0.05
        (30, 0, -0.05, True),  # diff +0.075: Tango's variance at +0.05 (no loss: 0.0475) passes it (p 0.011)
        (25, 0, -0.05, False),  # diff +0.0625: not enough
        (0, 0, 0.0, False),  # at margin 0 a tie is no evidence (Z 0, p 0.5)
        (0, 3, 1.0, True),  # a permissive margin
    ],
)
def test_offline_paired_noninferiority(wins, losses, margin, passed):
    v = _verdict(wins, losses, margin)
    assert v.passed is passed and v.offline_passed is passed and v.ope_passed is True
    o = v.offline
    assert (o["n"], o["wins"], o["losses"], o["ties"]) == (400, wins, losses, 400 - wins - losses)
    assert o["diff"] == pytest.approx((wins - losses) / 400) and o["margin"] == margin and o["passed"] is passed
    assert (o["lower"] > -margin) is passed and (o["p_value"] < 0.025) is passed
    assert v.reason.startswith(
        f"offline HR@5 challenger v3 {o['challenger']:.4f} vs champion v2 {o['champion']:.4f} "
        f"on 400 users (paired: {wins} won, {losses} lost"
    )
    assert f"{'>' if passed else '<='} -margin" in v.reason and "MDE" in v.reason


def test_one_user_does_not_decide_it():
    # with margin 0 and aggregate HR@5 one user of 100 decided; now one lost user of 400 moves nothing
    assert _verdict(0, 1).passed and _verdict(0, 2).passed and _verdict(1, 0).passed


def test_the_verdicts_numbers_are_tags_and_a_gate_result():
    v = _verdict(5, 9)
    tags = offline_tags("HR@5", v.offline)
    assert (
        tags["gate.offline.users"] == "400" and tags["gate.offline.wins"] == "5" and tags["gate.offline.losses"] == "9"
    )
    assert float(tags["gate.offline.lower"]) == pytest.approx(v.offline["lower"], rel=1e-5)
    assert {
        "gate.offline.diff",
        "gate.offline.margin",
        "gate.offline.p_value",
        "gate.offline.mde",
        "gate.offline.method",
    } <= set(tags) and tags["gate.offline.passed"] == str(v.offline_passed).lower()
    res = GateResult(
        arm="abpo",
        version="3",
        champion_version="2",
        passed=v.passed,
        reason=v.reason,
        metric="HR@5",
        challenger={},
        champion={},
        off_policy=None,
        offline=v.offline,
    )
    assert GateResult.from_json(res.to_json()) == res
    old = res.to_json()
    del old["offline"]  # a result recorded before the paired test reads back
    assert GateResult.from_json(old).offline is None


def test_ndcg_is_compared_user_by_user_too():
    # NDCG@5 sees the rank within the top 5: the 120 users both rank in it score 1 (rank 1) against 0.63 (rank 2)
    v = _verdict(0, 30, metric="NDCG@5")
    assert v.passed and (v.offline["wins"], v.offline["losses"]) == (120, 30) and "offline NDCG@5" in v.reason
    assert v.offline["diff"] == pytest.approx((120 * (1 - 1 / math.log2(3)) - 30 * 0.5) / 400)
    new, old = _ranks(400, 0, 30)
    v = gate_verdict(
        metric="NDCG@5",
        challenger_ranks=old,
        champion_ranks=new,
        margin=0.02,
        challenger_version="3",
        champion_version="2",
    )
    assert not v.passed and (v.offline["wins"], v.offline["losses"]) == (30, 120)


@pytest.mark.parametrize("margin", [NAN, INF, -INF])
def test_non_finite_margin_fails_closed(margin):
    v = _verdict(0, 0, margin)
    assert not v.passed and not v.offline_passed and "not finite" in v.reason and "fails closed" in v.reason
    assert v.offline == {} and offline_tags("HR@5", v.offline) == {}


def test_a_metric_without_per_user_values_is_an_error_naming_the_setting():
    with pytest.raises(ValueError, match="arms.gate_metric 'Diversity@5'.*rule: HR@K or NDCG@K"):
        _verdict(metric="Diversity@5")


def test_rank_lists_of_different_users_are_an_error():
    with pytest.raises(ValueError, match="same gate users"):
        gate_verdict(
            metric="HR@5",
            challenger_ranks=[1, 2],
            champion_ranks=[1],
            margin=0.02,
            challenger_version="3",
            champion_version="2",
        )


@pytest.mark.parametrize(
    ("ci_low", "ope_margin", "passed"),
    [(-0.05, 0.05, True), (-0.0501, 0.05, False), (0.0, 0.0, True), (-1e-9, 0.0, False)],
)
def test_off_policy_margin_on_the_lower_bound(ci_low, ope_margin, passed):
    v = _verdict(ope=_ope(ci_low=ci_low), ope_margin=ope_margin)
    assert v.offline_passed and v.ope_passed is passed and v.passed is passed
    assert ("-margin" in v.reason) and v.reason.endswith("(2026-02)")


def test_effective_sample_size_below_the_floor_fails_closed():
    assert _verdict(ope=_ope(challenger_ess=10.0), min_ess=10.0).passed  # at the floor passes
    v = _verdict(ope=_ope(challenger_ess=9.9), min_ess=10.0)
    assert not v.passed and "effective sample size 9.9" in v.reason and "< arms.gate_min_ess 10" in v.reason


@pytest.mark.parametrize("key", ["challenger_snips", "champion_snips", "diff", "ci_low", "ci_high", "challenger_ess"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF, None, "0.1"])
def test_any_non_finite_off_policy_number_fails_closed(key, bad):
    v = _verdict(ope=_ope(**{key: bad}))
    assert not v.passed and v.offline_passed and not v.ope_passed
    assert "off-policy estimate not finite" in v.reason and key in v.reason


def test_both_halves_must_pass():
    assert not _verdict(0, 30, ope=_ope()).passed  # offline fails, off-policy passes
    assert not _verdict(ope=_ope(ci_low=-0.5)).passed  # offline passes, off-policy fails
    assert _verdict(ope=_ope()).passed


@pytest.mark.parametrize(
    ("alpha", "power", "match"),
    [(0.0, 0.8, "arms.gate_alpha 0.0.*alpha = 0.0"), (0.025, 1.5, "arms.gate_power 1.5.*power = 1.5")],
)
def test_a_bad_level_or_power_is_an_error_naming_the_setting(alpha, power, match):
    new, old = _ranks(400, 0, 3)
    with pytest.raises(ValueError, match=match):
        gate_verdict(
            metric="HR@5",
            challenger_ranks=new,
            champion_ranks=old,
            margin=0.02,
            alpha=alpha,
            power=power,
            challenger_version="3",
            champion_version="2",
        )


def _verdict_ope(ope, wins=0, losses=0, n=400, **kw):
    new, old = _ranks(n, wins=wins, losses=losses, both=min(120, n // 4))
    args = dict(
        metric="HR@5",
        challenger_ranks=new,
        champion_ranks=old,
        margin=0.02,
        challenger_version="2",
        champion_version="1",
        ope=ope,
        ope_margin=0.005,
        primary="ope",
        guardrail_margin=0.10,
    )
    args.update(kw)
    return gate_verdict(**args)


@pytest.mark.parametrize(
    "ci_low, passed",
    [(-0.0049, True), (-0.005, True), (-0.0051, False), (+0.01, True)],
)
def test_the_off_policy_lower_bound_decides_against_a_margin_in_ctr_points(ci_low, passed):
    v = _verdict_ope(_ope(ci_low=ci_low))
    assert v.passed is passed and v.ope_passed is passed and v.offline_passed
    assert v.reason.startswith("decided by the off-policy half: off-policy"), v.reason
    assert "-margin 0.005" in v.reason and "; guardrail passed: offline guardrail HR@5" in v.reason


def test_the_offline_half_no_longer_decides_an_hr_tie_it_refuses_only_a_collapse():
    # 40 won, 43 lost: today's test at margin 0.02 refuses it (lower bound -0.053), the guardrail lets it through
    old = gate_verdict(
        metric="HR@5",
        challenger_ranks=_ranks(400, 40, 43)[0],
        champion_ranks=_ranks(400, 40, 43)[1],
        margin=0.02,
        challenger_version="2",
        champion_version="1",
        ope=_ope(ci_low=0.001),
        ope_margin=0.005,
        primary="offline",
    )
    assert not old.passed and not old.offline_passed and old.ope_passed
    new = _verdict_ope(_ope(ci_low=0.001), wins=40, losses=43)
    assert new.passed and new.offline_passed and new.offline["upper"] > -0.10
    # a collapse: 0 won, 80 lost of 400 (a loss of 0.20 HR@5) fails the guardrail whatever the off-policy half says
    bad = _verdict_ope(_ope(ci_low=0.02), wins=0, losses=80)
    assert not bad.passed and bad.ope_passed and not bad.offline_passed
    assert "guardrail failed" in bad.reason and ": a collapse" in bad.reason
    assert bad.offline["upper"] < -0.10


def test_the_guardrail_passes_an_equal_challenger_on_few_users():
    # 20 tied users: today's non-inferiority bound is -0.16 (it cannot show non-inferiority at 0.10), while the
    # guardrail's upper bound is +0.16: no evidence of a collapse, so it passes
    v = _verdict_ope(_ope(n=20, ci_low=0.0), n=20)
    assert v.passed and v.offline["upper"] > 0.1


def test_without_off_policy_numbers_the_offline_test_decides_and_says_so():
    v = _verdict_ope(None, wins=0, losses=30)
    assert not v.passed and v.reason.startswith("decided by the offline half (no month's logs read")
    assert "-margin -0.0200" in v.reason  # arms.gate_margin, not the guardrail's


def test_the_guardrail_margin_must_be_positive_and_the_primary_known():
    with pytest.raises(ValueError, match="arms.gate_guardrail_margin"):
        _verdict_ope(_ope(), guardrail_margin=0.0)
    with pytest.raises(ValueError, match="arms.gate_primary"):
        _verdict_ope(_ope(), primary="hr")
