"""The human approval of a promotion (``arms.approval``, abpo.monthly.approval, docs/gate.md "Approval"): what the
approval task shows, how Airflow's answer is read, and what the promote step does with each answer, recorded in the
promotion history. Real MLflow registry (SQLite), versions without model files; the DAG's task itself runs on the
real scheduler in tests/dags/test_approval_e2e.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from abpo.monthly import approval as approvals

GATE = {
    "arm": "abpo",
    "version": "3",
    "champion_version": "2",
    "passed": True,
    "reason": "offline HR@5 ... PASS; off-policy ... PASS",
    "metric": "HR@5",
    "offline": {
        "n": 400,
        "wins": 12,
        "losses": 9,
        "ties": 379,
        "diff": 0.0075,
        "lower": -0.0061,
        "margin": 0.02,
        "alpha": 0.025,
        "p_value": 0.0004,
        "power": 0.8,
        "mde": 0.0192,
    },
    "off_policy": {
        "estimator": "dr",
        "n": 5000,
        "diff": 0.0123,
        "ci_low": -0.0031,
        "ci_high": 0.0277,
        "confidence": 0.95,
        "challenger_ess": 812.4,
        "champion_ess": 4987.0,
    },
}


def test_the_request_shows_both_halves_of_the_gate():
    subject, body = approvals.request("abpo", "2026-03", GATE, "72h")
    assert subject == "Promote abpo v3 over champion v2 (2026-03)?"
    for shown in (
        "| Offline ΔHR@5 (challenger − champion) | +0.0075 on 400 users (12 won, 9 lost, 379 tied) |",
        "| Offline one-sided 97.5% lower bound | -0.0061 (passes above −margin -0.0200; p 0.0004) |",
        "| Offline MDE at 80% power | 0.0192 |",
        "| Off-policy ΔCTR (DR, on the month's logged rows it reads: arms.gate_ope_estimator) | +0.0123, 95% interval [-0.0031, +0.0277] on 5000 rows |",
        "| Off-policy ESS (challenger / champion) | 812.4 / 4987.0 |",
        "No answer within 72h counts as Reject.",
        "Gate's reason: offline HR@5 ... PASS",
    ):
        assert shown in body, (shown, body)
    # a gate without its off-policy half (arms.gate_ope_margin < 0) reads n/a, not a made-up number
    _, body = approvals.request("abpo", "2026-03", {**GATE, "off_policy": None}, "72h")
    assert (
        "| Off-policy ΔCTR (SNIPS, on the month's logged rows it reads: arms.gate_ope_estimator) | n/a, 95% interval [n/a, n/a] on ? rows |"
        in body
    )


def test_airflow_answers_read_as_decisions():
    at = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
    common = {"timeout": "72h", "asked_at": "2026-03-02T09:00:00+00:00", "task": "abpo.approve", "run_id": "r1"}
    yes = approvals.from_event(
        {
            "chosen_options": ["Approve"],
            "params_input": {"comment": "fine\nby me\u202e"},  # one line in the history, never a forged second one
            "responded_at": at,
            "responded_by_user": {"id": "alice", "name": "alice"},
        },
        **common,
    )
    assert (yes.decision, yes.by, yes.at, yes.comment) == (
        "approved",
        "alice",
        "2026-03-02T09:30:00+00:00",
        "fine by me",
    )
    assert yes.sentence() == (
        'approved by alice at 2026-03-02T09:30:00+00:00 (Airflow task abpo.approve, run r1): "fine by me"'
    )
    no = approvals.from_event(
        {"chosen_options": ["Reject"], "params_input": {}, "responded_at": at, "responded_by_user": {"name": "bob"}},
        **common,
    )
    assert (no.decision, no.by, no.comment) == ("rejected", "bob", "")
    # the scheduler's timeout sweep applies the default (Reject) with no user: a timeout, not bob's or anyone's reject
    late = approvals.from_event(
        {"chosen_options": ["Reject"], "responded_at": at, "responded_by_user": None, "timedout": True}, **common
    )
    assert (late.decision, late.by) == ("timed-out", "")
    assert late.sentence().startswith("no answer within arms.approval_timeout 72h (asked at 2026-03-02T09:00:00")
    err = approvals.from_event({"error": "timeout", "error_type": "timeout"}, **common)
    assert err.decision == "timed-out"
    assert approvals.Approval.from_json(yes.to_json()) == yes
    with pytest.raises(ValueError, match="decision is one of"):
        approvals.Approval.from_json({"decision": "maybe"})


@pytest.fixture
def reg(tmp_path, monkeypatch):
    """cfg (arms.approval = required): abpo-arm-abpo with versions 1..4, champion v1 (no history yet)."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    root = tmp_path / "var"
    monkeypatch.setenv("ABPO_STATE", str(root))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    cfg = load_config("tiny", ["arms.approval=required"])
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(4):
        client.create_model_version("abpo-arm-abpo", source=(root / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    return cfg


def _gate(version: str, champion: str):
    from abpo.monthly.gate import GateResult

    return GateResult(
        arm="abpo",
        version=version,
        champion_version=champion,
        passed=True,
        reason="test gate",
        metric="HR@5",
        challenger={},
        champion={},
        off_policy=None,
    )


def _answer(decision: str, by: str = "", comment: str = "") -> dict[str, str]:
    return approvals.Approval(
        decision, by=by, at="2026-03-02T09:30:00+00:00", comment=comment, timeout="72h", task="abpo.approve"
    ).to_json()


def test_the_promote_step_obeys_the_answer_and_records_it(reg):
    from abpo.arms import history, versions as arm_versions
    from abpo.monthly.promote import promote

    cfg = reg

    def champion() -> str:
        return str(arm_versions.get_version(cfg, "abpo", "champion").version)

    # rejected: the champion stays, the rejecter and the comment recorded; the same step again records nothing more
    for _ in range(2):
        out = promote(cfg, "abpo", _gate("2", "1"), "2026-01", _answer("rejected", "bob", "wait"))
        assert (out.promoted, out.moved, champion()) == (False, False, "1")
    assert out.approval["decision"] == "rejected" and "rejected by bob" in out.reason
    # no answer in time
    out = promote(cfg, "abpo", _gate("2", "1"), "2026-01", _answer("timed-out"))
    assert (out.promoted, champion()) == (False, "1")
    # no approval task asked (`abpo arms month`, or a DAG parsed without approval): refused, never promoted unasked
    out = promote(cfg, "abpo", _gate("2", "1"), "2026-01")
    assert (out.promoted, champion()) == (False, "1") and "no approval task asked" in out.reason
    # approved: promoted, the approver is the entry's actor and the version's approved_by
    out = promote(cfg, "abpo", _gate("3", "1"), "2026-02", _answer("approved", "alice", "ship it"))
    assert (out.promoted, out.moved, champion()) == (True, True, "3")
    tags = arm_versions.get_version(cfg, "abpo", "3").tags
    assert (tags["approved_by"], tags["approved_at"], tags["promoted_by"]) == (
        "alice",
        "2026-03-02T09:30:00+00:00",
        "alice",
    )
    got = [(e.action, e.actor, e.from_version, e.to_version, e.month) for e in history.entries(cfg, "abpo")]
    assert got == [
        ("baseline", "abpo", "", "1", "2026-01"),
        ("not-promoted", "bob", "1", "1", "2026-01"),
        ("not-promoted", "abpo", "1", "1", "2026-01"),
        ("not-promoted", "abpo", "1", "1", "2026-01"),
        ("gate", "alice", "1", "3", "2026-02"),
    ]
    reasons = [e.reason for e in history.entries(cfg, "abpo")][1:]
    assert reasons[0].startswith(
        'v2 rejected by bob at 2026-03-02T09:30:00+00:00 (Airflow task abpo.approve, run ): "wait"'
    )
    assert reasons[1].startswith("v2 no answer within arms.approval_timeout 72h")
    assert reasons[2].startswith("v2 arms.approval = required and no approval task asked")
    assert (
        reasons[3].startswith("approved by alice at 2026-03-02T09:30:00+00:00")
        and "gate passed: test gate" in reasons[3]
    )


def test_without_approval_an_answer_changes_nothing(reg):
    """arms.approval = none: the gate alone promotes (actor gate), as before approval existed."""
    import dataclasses

    from abpo.arms import history
    from abpo.monthly.promote import promote

    cfg = dataclasses.replace(reg, arms=dataclasses.replace(reg.arms, approval="none"))
    out = promote(cfg, "abpo", _gate("2", "1"), "2026-01")
    assert out.promoted and out.approval is None
    assert history.entries(cfg, "abpo")[-1].actor == "gate"


def test_the_reports_promotion_section_says_who_approved_or_rejected(reg):
    """abpo.monthly.promotion_report: one row per promote-step entry of the report's months, By = the approver."""
    from abpo.monthly.promote import promote
    from abpo.monthly.promotion_report import month_promotions, promotion_section_html, promotion_section_markdown

    cfg = reg
    promote(cfg, "abpo", _gate("2", "1"), "2026-01", _answer("rejected", "bob", "wait"))
    promote(cfg, "abpo", _gate("3", "1"), "2026-02", _answer("timed-out"))
    promote(cfg, "abpo", _gate("4", "1"), "2026-03", _answer("approved", "<b>alice</b>"))
    entries = month_promotions(cfg, ["2026-02", "2026-03"])
    assert [(e.month, e.action) for e in entries] == [("2026-02", "not-promoted"), ("2026-03", "gate")]
    md = promotion_section_markdown(month_promotions(cfg, ["2026-01", "2026-02", "2026-03"]))
    rows = [line.split(" | ")[:5] for line in md.splitlines() if line.startswith("| 2026-")]
    assert rows == [
        ["| 2026-01", "abpo", "rejected", "v1 stays", "bob"],
        ["| 2026-02", "abpo", "not approved in time", "v1 stays", "abpo"],
        ["| 2026-03", "abpo", "promoted, approved", "v1 -> v4", "&lt;b>alice&lt;/b>"],  # escaped, as in the HTML
    ]
    page = promotion_section_html(entries)
    assert "<td>&lt;b&gt;alice&lt;/b&gt;</td>" in page and "<b>alice" not in page
    assert "No challenger passed its gate" in promotion_section_markdown([])
