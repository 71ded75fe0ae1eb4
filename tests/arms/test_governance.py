"""Promotion governance (issue 31 item 4, issue 32 item 5): the append-only promotion history in the registry, pins,
rollback along that history, a hand move in MLflow detected at the month's start, a month whose champion moved
refusing its promotion, and the promotion lock's takeover by a lease. Real MLflow registry (SQLite), versions without
model files: promotion only reads and writes the registry."""

from __future__ import annotations

import pytest


@pytest.fixture
def reg(tmp_path, monkeypatch):
    """(cfg, client): abpo-arm-abpo with versions 1..5, champion v1 set directly (no history yet)."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    root = tmp_path / "var"
    monkeypatch.setenv("ABPO_STATE", str(root))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    monkeypatch.setenv("ABPO_ACTOR", "tester")
    cfg = load_config("tiny")
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(5):
        client.create_model_version("abpo-arm-abpo", source=(root / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    return cfg, client


@pytest.fixture
def abpo(capsys):
    """Run `abpo ARGS...` in this process: (rc, stdout, stderr)."""
    from abpo.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _champion(cfg) -> str:
    from abpo.arms import versions as arm_versions

    return str(arm_versions.get_version(cfg, "abpo", "champion").version)


def _gate(version: str, champion: str, passed: bool = True):
    from abpo.monthly.gate import GateResult

    return GateResult(
        arm="abpo",
        version=version,
        champion_version=champion,
        passed=passed,
        reason="test gate",
        metric="HR@5",
        challenger={},
        champion={},
        off_policy=None,
    )


def test_every_promotion_is_recorded_with_its_actor_and_the_history_is_append_only(reg, abpo):
    from mlflow.exceptions import MlflowException

    from abpo.arms import history

    cfg, client = reg
    rc, out, err = abpo(
        "arms", "promote", "--arm", "abpo", "--version", "2", "--reason", "first look", "--actor", "alice"
    )
    assert rc == 0, err
    first = [e.to_json() for e in history.entries(cfg, "abpo")]
    assert [(e["action"], e["actor"], e["from"], e["to"], e["reason"]) for e in first] == [
        ("baseline", "abpo", "", "1", "history started: champion as found"),
        ("promote", "alice", "1", "2", "first look"),
    ]
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "3", "--reason", "better")[0] == 0
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "2", "--reason", "again")[0] == 0  # v2 a 2nd time
    later = [e.to_json() for e in history.entries(cfg, "abpo")]
    assert later[:2] == first  # earlier promotions' records are never overwritten
    assert [(e["seq"], e["actor"], e["from"], e["to"], e["reason"]) for e in later[2:]] == [
        (3, "tester", "2", "3", "better"),
        (4, "tester", "3", "2", "again"),
    ]
    # an entry cannot be rewritten through MLflow: its fields are params
    with pytest.raises(MlflowException):
        client.log_param(history.entries(cfg, "abpo")[1].run_id, "actor", "mallory")
    assert history.entries(cfg, "abpo")[1].actor == "alice"
    rc, out, _ = abpo("arms", "history", "--arm", "abpo")
    assert rc == 0 and len(out.strip().splitlines()) == 4 and "v1 -> v2" in out and "by alice: first look" in out


def test_a_hand_move_in_mlflow_is_recorded_pinned_and_respected_by_the_gate(reg):
    from abpo.arms import history, promotion
    from abpo.monthly.bootstrap import bootstrap_arms
    from abpo.monthly.promote import promote

    cfg, client = reg
    cfg.arms.names = ["abpo"]
    promotion.promote(cfg, "abpo", "2", reason="gate")
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "4")  # by hand, outside abpo
    got = bootstrap_arms(cfg, "2026-03").arms["abpo"]
    assert got["moved_by_hand"] == {"from": "2", "to": "4"} and got["version"] == "4"
    last = history.entries(cfg, "abpo")[-1]
    assert (last.action, last.actor, last.from_version, last.to_version, last.month) == (
        "mlflow-ui",
        "mlflow-ui",
        "2",
        "4",
        "2026-03",
    )
    assert promotion.pinned(cfg, "abpo")["version"] == "4"
    assert "moved_by_hand" not in bootstrap_arms(cfg, "2026-03").arms["abpo"]  # recorded once
    # the gate passes a challenger of v4: it is not promoted over the human's choice
    res = promote(cfg, "abpo", _gate("5", "4"), "2026-03")
    assert (res.promoted, res.moved, res.champion_version) == (False, False, "4")
    assert res.reason.startswith("pinned: not promoted")
    assert history.entries(cfg, "abpo")[-1].action == "not-promoted"


def test_a_pinned_champion_survives_a_passing_gate_until_unpinned(reg, abpo):
    from abpo.arms import history
    from abpo.monthly.promote import promote

    cfg, _ = reg
    rc, out, err = abpo("arms", "pin", "--arm", "abpo", "--reason", "holiday freeze", "--actor", "ops")
    assert rc == 0 and "champion v1 pinned" in out, err
    res = promote(cfg, "abpo", _gate("2", "1"), "2026-02")
    assert (res.promoted, res.moved, _champion(cfg)) == (False, False, "1")
    assert "pinned by ops" in res.reason and "holiday freeze" in res.reason
    assert abpo("arms", "unpin", "--arm", "abpo")[0] == 0
    res = promote(cfg, "abpo", _gate("2", "1"), "2026-02")
    assert (res.promoted, res.moved, _champion(cfg)) == (True, True, "2")
    assert [(e.action, e.actor) for e in history.entries(cfg, "abpo")] == [
        ("baseline", "abpo"),
        ("pin", "ops"),
        ("not-promoted", "gate"),
        ("unpin", "tester"),
        ("gate", "gate"),
    ]


def test_rollback_returns_to_the_previous_champion_in_the_history(reg, abpo):
    from abpo.arms import promotion

    cfg, client = reg
    promotion.promote(cfg, "abpo", "2")
    promotion.promote(cfg, "abpo", "3")
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "2")  # by hand: v2 carries promoted_from=1
    rc, out, err = abpo("arms", "rollback", "--arm", "abpo", "--reason", "undo the hand move")
    assert rc == 0 and "champion v3 (was v2)" in out, err  # not v1, where v2's promoted_from tag points
    assert abpo("arms", "rollback", "--arm", "abpo")[1].strip().endswith("champion v2 (was v3)")
    assert abpo("arms", "rollback", "--arm", "abpo")[1].strip().endswith("champion v1 (was v2)")
    rc, _, err = abpo("arms", "rollback", "--arm", "abpo")
    assert rc == 2 and "no previous champion in the promotion history" in err


def test_rollback_to_a_deleted_version_is_refused_and_changes_nothing(reg, abpo):
    from abpo.arms import history, promotion, versions as arm_versions

    cfg, client = reg
    promotion.promote(cfg, "abpo", "2")
    promotion.promote(cfg, "abpo", "3")
    client.delete_model_version("abpo-arm-abpo", "2")
    before = [e.to_json() for e in history.entries(cfg, "abpo")]
    rc, out, err = abpo("arms", "rollback", "--arm", "abpo")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "previous champion v2 no longer exists" in err and "nothing changed" in err
    assert _champion(cfg) == "3"
    assert "rolled_back_to" not in (arm_versions.get_version(cfg, "abpo", "3").tags or {})
    assert [e.to_json() for e in history.entries(cfg, "abpo")] == before


def test_a_rollback_during_the_month_stops_its_promotion_with_a_message(reg, abpo):
    from abpo.arms import history, promotion
    from abpo.monthly.gate import month_start_champion
    from abpo.monthly.promote import promote

    cfg, client = reg
    promotion.promote(cfg, "abpo", "2")
    client.set_model_version_tag("abpo-arm-abpo", "4", "parent_version", "2")  # the month's update started from v2
    assert abpo("arms", "rollback", "--arm", "abpo", "--reason", "bad CTR")[0] == 0  # during the month: v1
    champ = month_start_champion(cfg, "abpo", "4")  # the gate compares against the champion the update read
    assert str(champ.version) == "2"
    res = promote(cfg, "abpo", _gate("4", str(champ.version)), "2026-02")
    assert (res.promoted, res.moved, res.champion_version) == (False, False, "1")
    assert "not the expected v2" in res.reason and "rollback by tester" in res.reason and "bad CTR" in res.reason
    last = history.entries(cfg, "abpo")[-1]
    assert last.action == "not-promoted" and last.to_version == "1" and "champion moved during the month" in last.reason


def test_a_pending_entry_of_a_mover_that_died_is_settled_by_the_next_writer(reg):
    from abpo.arms import history, promotion

    cfg, client = reg
    promotion.promote(cfg, "abpo", "2")
    # a mover wrote its entry, moved the alias, and died before finishing the entry
    history.begin(cfg, "abpo", action="promote", actor="dead", from_version="2", to_version="3")
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "3")
    assert promotion.check_champion(cfg, "abpo", "2026-02") is None  # not mistaken for a hand move
    assert [(e.actor, e.to_version) for e in history.entries(cfg, "abpo")][-1] == ("dead", "3")
    # one that died before moving the alias: its entry is not history
    history.begin(cfg, "abpo", action="promote", actor="dead2", from_version="3", to_version="4")
    promotion.promote(cfg, "abpo", "5")
    assert [e.actor for e in history.entries(cfg, "abpo")] == ["abpo", "tester", "dead", "tester"]


@pytest.mark.parametrize(
    "tags", [{}, {"owner": "fast:1:x", "acquired_at": "9999999999"}], ids=["no-owner", "holder-clock-a-day-fast"]
)
def test_a_stale_lock_is_taken_over_by_the_waiters_own_clock(reg, tags):
    import time

    from abpo.arms import promotion_lock

    cfg, client = reg
    client.create_registered_model("abpo-lock-abpo", tags=tags)  # a crashed holder's lock
    t = time.monotonic()
    with promotion_lock.promotion_lock(cfg, "abpo", wait_s=20, ttl_s=0.5):
        pass
    assert time.monotonic() - t < 10
    assert not client.search_registered_models("name = 'abpo-lock-abpo'")


def test_a_live_holder_keeps_its_lock_whatever_its_clock(reg):
    from abpo.arms import promotion_lock

    cfg, _ = reg
    with promotion_lock.promotion_lock(cfg, "abpo"):
        with pytest.raises(promotion_lock.PromotionRace, match="another promotion holds the lock"):
            with promotion_lock.promotion_lock(cfg, "abpo", wait_s=1.5, ttl_s=5):
                pass
        promotion_lock.touch_lock(cfg, "abpo")  # still ours
