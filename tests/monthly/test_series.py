"""The series a state runs (abpo.monthly.series): the first bootstrap records the split settings; once the warehouse
holds a month, a setting that changes the data split (data.update_steps, ...) is refused naming the key, recorded
and asked-for values, and never applied; before any month it is taken (recorded again). The refusal fails the
Airflow task without retry (abpo.monthly.common.retry_or_fail)."""

from __future__ import annotations

import json

import pytest


def test_a_split_change_is_refused_once_the_warehouse_holds_a_month(make_cfg, movielens):
    from abpo.data.splits import split_users
    from abpo.monthly.common import retry_or_fail
    from abpo.monthly.ingest import ingest
    from abpo.monthly.series import SeriesChanged, check_series, series_file
    from abpo.sim.simulator import simulate_month
    from tests.ranker_arms import popularity_served_arms

    cfg = make_cfg("data.max_users=60", "data.update_steps=4")
    check_series(cfg, "2026-01")
    assert json.loads(series_file(cfg).read_text())["settings"]["data.update_steps"] == 4
    # no month in the warehouse yet: another split is taken and recorded
    check_series(make_cfg("data.max_users=60", "data.update_steps=6"), "2026-01")
    assert json.loads(series_file(cfg).read_text())["settings"]["data.update_steps"] == 6
    check_series(cfg, "2026-01")

    splits, _ = split_users(movielens, cfg.data)
    simulate_month(cfg, "2026-01", popularity_served_arms(cfg, movielens, splits), dataset=movielens, splits=splits)
    ingest(cfg, "2026-01")
    check_series(cfg, "2026-02")  # the same settings: fine
    changed = make_cfg("data.max_users=60", "data.update_steps=12")
    with pytest.raises(SeriesChanged, match=r"data.update_steps = 12 \(recorded 4\): rule: the data split") as e:
        check_series(changed, "2026-02")
    assert retry_or_fail(e.value) == "fail"
    assert json.loads(series_file(cfg).read_text())["settings"]["data.update_steps"] == 4  # not applied
    with pytest.raises(SeriesChanged, match=r"data.max_users = 0 \(recorded 60\)"):
        check_series(make_cfg("data.update_steps=4"), "2026-02")
    check_series(
        make_cfg(
            "data.max_users=60", "data.update_steps=4", "sim.base_ctr=0.3", "data.eval_hard_negative_fraction=0.5"
        ),
        "2026-02",
    )  # not split settings: taken
