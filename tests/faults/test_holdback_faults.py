"""The holdback stays the control it started as (issue 48, item 12): its champion swapped in MLflow for another
version that also carries source=pi_init (same tags, another model) is refused by the hold step, which compares the
champion with the version its promotion history started with."""

from __future__ import annotations

import pytest


def test_a_holdback_champion_swapped_for_another_pi_init_version_is_refused(state):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import history
    from abpo.config import load_config
    from abpo.monthly.hold import HoldbackMoved, hold

    cfg = load_config("tiny")
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-holdback")
    for _ in range(2):
        client.create_model_version(
            "abpo-arm-holdback", source=(state / "nothing").as_uri(), tags={"source": "pi_init", "parent_version": ""}
        )
    client.set_registered_model_alias("abpo-arm-holdback", "champion", "1")
    history.record(cfg, "holdback", action="bootstrap", actor="abpo", from_version="", to_version="1")
    assert hold(cfg, "holdback", "2026-01").champion_version == "1"

    client.set_registered_model_alias("abpo-arm-holdback", "champion", "2")  # by hand in MLflow
    with pytest.raises(HoldbackMoved, match="champion is not v1, the version its promotion history started with"):
        hold(cfg, "holdback", "2026-02")
