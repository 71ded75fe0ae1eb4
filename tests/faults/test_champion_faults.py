"""A deleted champion is a refusal, not a silent start-over (issue 48, item 2): an arm whose champion version was
deleted in MLflow (its alias gone with it) while its promotion history names one is refused by bootstrap, naming the
history's last champion, and `abpo arms rollback` restores it (or, when that version is gone, the newest earlier
champion of the history that still exists)."""

from __future__ import annotations

from tests.faults.registry_versions import registry_with_versions


def _client_and_cfg():
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    cfg = load_config("tiny")
    registry.configure(cfg)
    return MlflowClient(), cfg


def test_a_deleted_champion_is_refused_by_bootstrap_and_rollback_restores_the_one_before(abpo, state):
    registry_with_versions(state, 3)
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "2", "--reason", "better")[0] == 0
    client, cfg = _client_and_cfg()
    client.delete_model_version("abpo-arm-abpo", "2")  # by hand in MLflow: the champion alias goes with it
    before = sorted(int(v.version) for v in client.search_model_versions("name='abpo-arm-abpo'"))

    rc, out, err = abpo("arms", "bootstrap")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "abpo-arm-abpo: no champion, but its promotion history's last champion is v2" in err, err
    assert "abpo arms rollback --arm abpo" in err and "nothing was registered" in err
    assert sorted(int(v.version) for v in client.search_model_versions("name='abpo-arm-abpo'")) == before
    assert not client.search_registered_models("name = 'abpo-recommender'")  # no pi_init trained or registered

    rc, out, err = abpo("arms", "status")  # was "champion none", exit 0
    assert rc == 1 and "abpo-arm-abpo          champion   none: MISSING (abpo-arm-abpo: no champion, but its" in out
    assert "history's last champion is v2" in out, out

    rc, out, err = abpo("arms", "rollback", "--arm", "abpo", "--reason", "v2 deleted")
    assert rc == 0 and "abpo-arm-abpo: champion v1 (was vnone)" in out, err
    from abpo.arms import history

    last = history.entries(cfg, "abpo")[-1]
    assert (last.action, last.from_version, last.to_version) == ("rollback", "", "1")
    assert "restored the history's last champion v2 (deleted), its newest earlier champion v1" in last.reason
    assert history.champion_stack(history.entries(cfg, "abpo")) == ["1"]


def test_a_removed_champion_alias_is_restored_to_the_same_version(abpo, state):
    registry_with_versions(state, 3)
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "3")[0] == 0
    client, cfg = _client_and_cfg()
    client.delete_registered_model_alias("abpo-arm-abpo", "champion")
    rc, out, err = abpo("arms", "rollback", "--arm", "abpo")
    assert rc == 0 and "champion v3 (was vnone)" in out, err
    assert str(client.get_model_version_by_alias("abpo-arm-abpo", "champion").version) == "3"


def test_an_arm_with_no_history_and_no_champion_has_nothing_to_restore(abpo, state):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    registry.configure(load_config("tiny"))
    MlflowClient().create_registered_model("abpo-arm-abpo")
    rc, out, err = abpo("arms", "rollback", "--arm", "abpo")
    assert rc == 2 and "no champion, and its promotion history names none" in err, err


def test_a_missing_champion_is_a_refusal_for_the_dag():
    from abpo.arms.history import ChampionMissing
    from abpo.monthly.common import retry_or_fail

    assert retry_or_fail(ChampionMissing("x")) == "fail"
