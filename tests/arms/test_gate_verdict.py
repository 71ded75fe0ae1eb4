"""abpo's gate decision as a pure function (gate_verdict): each margin at, just inside and just outside its bound,
and every non-finite input failing closed. No registry and no MLflow: the numbers in, the verdict out."""

from __future__ import annotations

import math

import pytest

from abpo.monthly.gate import gate_verdict

NAN, INF = math.nan, math.inf


def _ope(**kw) -> dict:
    ope = {"n": 400, "challenger_snips": 0.21, "champion_snips": 0.20, "diff": 0.01, "ci_low": -0.02,
           "ci_high": 0.04, "confidence": 0.95, "challenger_ess": 300.0, "champion_ess": 400.0}
    ope.update(kw)
    return ope


def _verdict(new: float, old: float, margin: float = 0.0, ope: dict | None = None, ope_margin: float = 0.05,
             min_ess: float = 10.0):
    return gate_verdict(metric="HR@5", challenger={"HR@5": new, "NDCG@5": 0.1}, champion={"HR@5": old},
                        margin=margin, challenger_version="3", champion_version="2", ope=ope, ope_margin=ope_margin,
                        min_ess=min_ess, month="2026-02")


@pytest.mark.parametrize(("new", "old", "margin", "passed"), [
    (0.30, 0.30, 0.0, True),     # equal passes: challenger >= champion - 0
    (0.29, 0.30, 0.0, False),    # below by anything fails with margin 0
    (0.28, 0.30, 0.02, True),    # exactly at champion - margin passes
    (0.279, 0.30, 0.02, False),  # just below champion - margin fails
    (0.10, 0.30, 1.0, True),     # a permissive margin
    (0.35, 0.30, -0.1, False),   # a negative margin demands an improvement of more than 0.1
    (0.41, 0.30, -0.1, True),
])
def test_offline_margin(new, old, margin, passed):
    v = _verdict(new, old, margin)
    assert v.passed is passed and v.offline_passed is passed and v.ope_passed is True
    assert v.reason.startswith(f"offline HR@5 challenger v3 {new:.4f} {'>=' if passed else '<'} champion v2 {old:.4f}")


@pytest.mark.parametrize(("new", "old", "margin"), [(NAN, 0.3, 0.0), (0.3, NAN, 0.0), (INF, 0.3, 0.0),
                                                    (0.3, -INF, 0.0), (0.3, 0.3, NAN), (0.3, 0.3, INF)])
def test_non_finite_offline_input_fails_closed(new, old, margin):
    v = _verdict(new, old, margin)
    assert not v.passed and not v.offline_passed and "not finite" in v.reason and "fails closed" in v.reason


def test_a_missing_metric_is_an_error_naming_the_setting():
    with pytest.raises(ValueError, match="arms.gate_metric"):
        gate_verdict(metric="HR@10", challenger={"HR@5": 0.3}, champion={"HR@5": 0.3}, margin=0.0,
                     challenger_version="3", champion_version="2")


@pytest.mark.parametrize(("ci_low", "ope_margin", "passed"), [(-0.05, 0.05, True), (-0.0501, 0.05, False),
                                                              (0.0, 0.0, True), (-1e-9, 0.0, False)])
def test_off_policy_margin_on_the_lower_bound(ci_low, ope_margin, passed):
    v = _verdict(0.3, 0.3, ope=_ope(ci_low=ci_low), ope_margin=ope_margin)
    assert v.offline_passed and v.ope_passed is passed and v.passed is passed
    assert ("-margin" in v.reason) and v.reason.endswith("(2026-02)")


def test_effective_sample_size_below_the_floor_fails_closed():
    assert _verdict(0.3, 0.3, ope=_ope(challenger_ess=10.0), min_ess=10.0).passed  # at the floor passes
    v = _verdict(0.3, 0.3, ope=_ope(challenger_ess=9.9), min_ess=10.0)
    assert not v.passed and "effective sample size 9.9" in v.reason and "< arms.gate_min_ess 10" in v.reason


@pytest.mark.parametrize("key", ["challenger_snips", "champion_snips", "diff", "ci_low", "ci_high", "challenger_ess"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF, None, "0.1"])
def test_any_non_finite_off_policy_number_fails_closed(key, bad):
    v = _verdict(0.3, 0.3, ope=_ope(**{key: bad}))
    assert not v.passed and v.offline_passed and not v.ope_passed
    assert "off-policy estimate not finite" in v.reason and key in v.reason


def test_both_halves_must_pass():
    assert not _verdict(0.2, 0.3, ope=_ope()).passed  # offline fails, off-policy passes
    assert not _verdict(0.3, 0.3, ope=_ope(ci_low=-0.5)).passed  # offline passes, off-policy fails
    assert _verdict(0.3, 0.3, ope=_ope()).passed
