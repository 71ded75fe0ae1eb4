"""Promotion and rollback by the CLI: concurrent promotions, unknown versions and arms, a second rollback, a corrupt
MLflow store (issue 18, items 3 and 7)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.registry_versions import registry_with_versions

REPO = Path(__file__).resolve().parents[2]


def test_concurrent_promotions_expecting_the_same_champion_move_it_once(state):
    registry_with_versions(state)
    env = {**os.environ, "ABPO_STATE": str(state)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "abpo.cli",
                "arms",
                "promote",
                "--arm",
                "abpo",
                "--version",
                str(v),
                "--expect-champion",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in (2, 3, 4)
    ]
    outs = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    won = [o for o in outs if o[0] == 0]
    lost = [o for o in outs if o[0] != 0]
    assert len(won) == 1 and len(lost) == 2, outs
    assert "(was v1)" in won[0][1]
    for rc, _out, err in lost:
        assert rc == 2 and "not the expected v1" in err and "Traceback" not in err, err
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config

    champ = arm_versions.get_version(load_config("tiny"), "abpo", "champion")
    assert f"champion v{champ.version} (was v1)" in won[0][1]
    assert champ.tags["promoted_from"] == "1"


def test_the_promotion_lock_is_exclusive_and_taken_over_when_stale(state):
    from mlflow import MlflowClient

    from abpo.arms import promotion, promotion_lock
    from abpo.config import load_config

    registry_with_versions(state, 2)
    cfg = load_config("tiny")
    with promotion_lock.promotion_lock(cfg, "abpo"):
        with pytest.raises(promotion_lock.PromotionRace, match="another promotion holds the lock"):
            with promotion_lock.promotion_lock(cfg, "abpo", wait_s=0.5):
                pass
    # a holder that crashed does not block promotions for ever: one of another host after the lease (shortened here),
    # one of this host at once, its process being gone
    MlflowClient().create_registered_model("abpo-lock-abpo", tags={"owner": "dead:1:x", "acquired_at": "0"})
    with pytest.MonkeyPatch.context() as m:
        m.setattr(promotion_lock, "LOCK_TTL_S", 1.0)
        assert promotion.promote(cfg, "abpo", "2", expected_champion="1")["champion"] == "2"
    gone = subprocess.Popen(["true"])
    gone.wait()
    MlflowClient().create_registered_model("abpo-lock-abpo", tags={"owner": f"{socket.gethostname()}:{gone.pid}:x"})
    assert promotion.promote(cfg, "abpo", "1", expected_champion="2")["champion"] == "1"
    assert not MlflowClient().search_registered_models("name = 'abpo-lock-abpo'")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["arms", "promote", "--arm", "abpo", "--version", "99"], "abpo-arm-abpo: no version 99"),
        (["arms", "promote", "--arm", "nosuch", "--version", "1"], "arm 'nosuch': unknown"),
        (["arms", "rollback", "--arm", "abpo"], "has no previous champion"),
    ],
)
def test_a_missing_version_or_arm_is_one_line(abpo, state, argv, says):
    registry_with_versions(state, 2)
    rc, out, err = abpo(*argv)
    assert rc == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_second_rollback_is_a_message(abpo, state):
    registry_with_versions(state, 2)
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "2")[0] == 0
    assert abpo("arms", "rollback", "--arm", "abpo")[0] == 0
    rc, out, err = abpo("arms", "rollback", "--arm", "abpo")
    assert rc == 2 and "champion v1 has no previous champion" in err and "Traceback" not in err


def test_a_corrupt_mlflow_store_is_a_message_and_debug_gives_the_traceback(abpo, state):
    state.mkdir(parents=True)
    (state / "mlflow.db").write_bytes(b"not a database " * 400)
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and "the store cannot be opened" in err and "Traceback" not in err, err
    rc, out, err = abpo("arms", "status", "--debug")
    assert rc == 2 and "Traceback" in err


def test_the_core_registry_reads_a_corrupt_store_as_unavailable_not_as_no_champion(state):
    from abpo import registry
    from abpo.config import load_config

    state.mkdir(parents=True)
    (state / "mlflow.db").write_bytes(b"not a database " * 400)
    with pytest.raises(registry.RegistryUnavailable, match="the store cannot be opened"):  # where it is opened
        registry.configure(load_config("tiny"))
    with pytest.raises(registry.RegistryUnavailable, match="the store cannot be opened"):
        registry.get_version(registry.CHAMPION, cfg=load_config("tiny"))
