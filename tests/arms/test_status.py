"""Where each arm stands (abpo.arms.status, what `abpo arms status` prints) and an entry of the promotion history as
the line `abpo arms history` prints (abpo.arms.history.Entry.line). Real MLflow registry (SQLite), versions without
model files."""

from __future__ import annotations


def test_each_arm_shows_its_champion_and_challenger_and_a_champion_gone_missing(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import promotion, versions as arm_versions
    from abpo.arms.status import AliasStatus, arm_status
    from abpo.config import load_config

    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "var"))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    cfg = load_config("tiny")
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(2):
        client.create_model_version("abpo-arm-abpo", source=(tmp_path / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    client.set_registered_model_alias("abpo-arm-abpo", "challenger", "2")

    got = list(arm_status(cfg, ["abpo", "grpo"]))
    v1, v2 = (arm_versions.get_version(cfg, "abpo", a) for a in ("champion", "challenger"))
    assert got == [
        AliasStatus("abpo-arm-abpo", "champion", arm_versions.version_info(v1)),
        AliasStatus("abpo-arm-abpo", "challenger", arm_versions.version_info(v2)),
        AliasStatus("abpo-arm-grpo", "champion", None),  # a new arm: no history names a champion
        AliasStatus("abpo-arm-grpo", "challenger", None),
    ]
    assert got[0].info["version"] == "1"

    promotion.promote(cfg, "abpo", "2", reason="test")  # recorded: the history now names v2
    client.delete_registered_model_alias("abpo-arm-abpo", "champion")  # by hand, outside abpo
    champion = next(arm_status(cfg, ["abpo"]))
    assert (champion.alias, champion.info) == ("champion", None)
    assert champion.missing.startswith("abpo-arm-abpo: no champion, but its promotion history's last champion is v2")


def test_a_history_entry_is_one_line_with_its_move_its_actor_and_its_reason():
    from abpo.arms.history import Entry

    moved = Entry(3, "abpo", "promote", "alice", "2026-03-01T00:00:00+00:00", "1", "2", "better", "pass: +0.01")
    assert moved.line() == (
        "abpo        #3    2026-03-01T00:00:00+00:00  promote      v1 -> v2       by alice: better verdict pass: +0.01"
    )
    first = Entry(1, "grpo", "bootstrap", "abpo", "2026-01-01T00:00:00+00:00", "", "1", "x" * 200, "", "2026-01")
    assert first.line().endswith(f"v- -> v1       by abpo: {'x' * 160} month 2026-01")
    held = Entry(2, "grpo", "pin", "bob", "2026-02-01T00:00:00+00:00", "1", "1", "hold it", "v" * 100)
    assert held.line().endswith("  pin          v1             by bob: hold it verdict " + "v" * 80)
