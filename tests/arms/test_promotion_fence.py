"""A stalled promotion cannot undo an operator's rollback: the month stopped inside promote with its checks done,
just before it moved the alias; `abpo arms rollback` took the lock over after its lease and rolled back, and the
month then moved `champion` anyway (the history said v1, the registry v3, and the next month pinned abpo's own move
as a hand move). Now the move is fenced (abpo.arms.promotion_lock.fence): at the call that moves the alias, the lock
must still be the mover's and the champion the one it checked. And what a killed mover leaves (a pending history
entry, a held lock) shows in `abpo arms status`. Real MLflow registry (SQLite); the stall is a monkeypatched hook at
the call that moves the alias."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from tests.faults.registry_versions import registry_with_versions


@pytest.fixture
def reg(state):
    from mlflow import MlflowClient

    from abpo.arms import promotion
    from abpo.config import load_config

    registry_with_versions(state, 3)
    cfg = load_config("tiny")
    promotion.promote(cfg, "abpo", "2", reason="the month before")  # champion v2; a rollback goes back to v1
    return cfg, MlflowClient()


def _champion(client) -> str:
    return str(client.get_model_version_by_alias("abpo-arm-abpo", "champion").version)


def _stall_at_the_move(monkeypatch, to_version: str, meanwhile) -> list:
    """The mover of ``to_version`` stops at the call that moves the alias (after its checks under the lock) while
    ``meanwhile()`` runs in another thread (as another process would: its own lock token), then resumes."""
    from abpo.arms import promotion

    real, seen = promotion.set_alias, []

    def stalled(cfg, arm, alias, version, **kw):
        if str(version) == to_version and not seen:
            seen.append(version)
            other = threading.Thread(target=meanwhile)
            other.start()
            other.join(timeout=60)  # the stall: as long as the other holder takes
        return real(cfg, arm, alias, version, **kw)

    monkeypatch.setattr(promotion, "set_alias", stalled)
    return seen


def _operator_rolls_back(cfg, monkeypatch, done: list):
    from abpo.arms import promotion, promotion_lock

    # the operator's rollback waits out the stalled holder's lease (shortened here: the lease's length is not what
    # is tested, what happens after it is)
    monkeypatch.setattr(promotion_lock, "LOCK_TTL_S", 0.5)

    def rollback():
        done.append(promotion.rollback(cfg, "abpo", reason="operator: CTR dropped", actor="alice"))

    return rollback


def test_a_stalled_month_s_promotion_does_not_undo_the_operator_s_rollback(reg, monkeypatch, caplog):
    from abpo.arms import history, promotion, promotion_lock

    cfg, client = reg
    done: list = []
    seen = _stall_at_the_move(monkeypatch, "3", _operator_rolls_back(cfg, monkeypatch, done))
    with pytest.raises(promotion_lock.ChampionMoved, match="champion is v1, not the expected v2") as e:
        promotion.promote(
            cfg, "abpo", "3", expected_champion="2", action="gate", actor="gate", month="2026-02", reason="gate passed"
        )
    assert seen == ["3"] and done == [{"arm": "abpo", "champion": "1", "previous": "2"}]
    assert "rollback by alice" in str(e.value)
    assert _champion(client) == "1"  # the operator's rollback stands
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "abpo-arm-abpo: the promotion lock 'abpo-lock-abpo' is no longer this promotion's" in said, said
    assert "champion is v1, not v2 as checked" in said and "v3 not moved" in said
    entries = history.entries(cfg, "abpo")
    assert [(x.action, x.to_version) for x in entries if x.moved][-1] == ("rollback", "1")
    assert (entries[-1].action, entries[-1].month) == ("not-promoted", "2026-02")
    assert history.champion_stack(entries)[-1] == "1" and not history.pending(cfg, "abpo")
    # the next month finds history and registry agreeing: no hand move recorded, nothing pinned
    assert promotion.check_champion(cfg, "abpo", "2026-03") is None
    assert promotion.pinned(cfg, "abpo") is None


def test_a_human_s_promotion_fenced_out_is_one_line_and_not_replayed(abpo, reg, monkeypatch):
    cfg, client = reg
    done: list = []
    _stall_at_the_move(monkeypatch, "3", _operator_rolls_back(cfg, monkeypatch, done))
    rc, out, err = abpo("arms", "promote", "--arm", "abpo", "--version", "3")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "abpo-arm-abpo: the promotion lock 'abpo-lock-abpo' is no longer this promotion's" in err, err
    assert "champion is v1, not v2 as checked" in err and "rule: only the lock's holder moves the champion" in err
    assert err.strip().endswith("v3 not moved"), err
    assert _champion(client) == "1"


def test_a_champion_moved_by_hand_during_the_stall_is_not_overwritten(reg, monkeypatch):
    from abpo.arms import promotion, promotion_lock

    cfg, client = reg
    _stall_at_the_move(monkeypatch, "3", lambda: client.set_registered_model_alias("abpo-arm-abpo", "champion", "1"))
    with pytest.raises(promotion_lock.MoveFenced) as e:
        promotion.promote(cfg, "abpo", "3")
    assert str(e.value) == (
        "abpo-arm-abpo: champion is v1, not v2 as checked under the promotion lock 'abpo-lock-abpo' (moved without "
        "the lock); rule: the champion moves only from the version checked; v3 not moved"
    )
    assert _champion(client) == "1"


def test_the_lease_outlasts_a_loaded_worker_s_stall_and_a_gone_holder_is_taken_over_at_once(reg):
    from abpo.arms import promotion, promotion_lock

    assert promotion_lock.LOCK_TTL_S >= 60 and promotion_lock.LOCK_WAIT_S > promotion_lock.LOCK_TTL_S
    cfg, client = reg
    gone = subprocess.Popen(["true"])
    gone.wait()
    client.create_registered_model("abpo-lock-abpo", tags={"owner": f"{socket.gethostname()}:{gone.pid}:x"})
    t = time.monotonic()
    assert promotion.promote(cfg, "abpo", "3", expected_champion="2")["champion"] == "3"
    assert time.monotonic() - t < 10  # not the lease: its holder is gone from this host
    assert not client.search_registered_models("name = 'abpo-lock-abpo'")


def test_status_shows_a_pending_entry_and_a_held_lock_left_by_a_killed_mover(abpo, reg):
    from abpo.arms import history

    cfg, client = reg
    # killed right after the alias moved: its entry pending, its lock held (a process of another host)
    history.begin(cfg, "abpo", action="promote", actor="gate", from_version="2", to_version="3", month="2026-02")
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "3")
    client.create_registered_model("abpo-lock-abpo", tags={"owner": "worker-2:4242:abc", "lease": "1"})
    rc, out, err = abpo("arms", "status")
    assert rc == 0, err
    lines = [line for line in out.splitlines() if "UNFINISHED" in line]
    assert len(lines) == 2, out
    assert lines[0].startswith("abpo-arm-abpo          UNFINISHED pending history entry #")
    assert ": promote v2 -> v3 by gate at " in lines[0] and "not finished" in lines[0]
    assert "promotion lock 'abpo-lock-abpo' held by worker-2:4242:abc since " in lines[1] and " s ago" in lines[1]
    assert "unchanged for 120 s" in lines[1]
