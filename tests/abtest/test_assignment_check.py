"""The report's integrity checks before any test (issue 48 item 7): every logged user in the arm the experiment's
salted hash assigns them, no arm dominated by one user, and a sample-ratio check that does not pass on a handful of
users. The reproduction: one user's impressions spread over four arms gave "abpo vs grpo -8.07 pp, z = -87" and "No
sample-ratio mismatch ... users per arm match the configured shares" with one user per arm."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from abpo.abtest import stats
from abpo.abtest.analysis import ALL
from abpo.abtest.assignment import assign_arm, assign_users, check_shares, cumulative_bounds
from abpo.abtest.render import NOT_TESTED, headline, srm_verdict
from abpo.abtest.report import build_from_warehouse
from abpo.cli import main

from .conftest import ARMS, impressions_log

MONTH = "2026-02"
SHARES = {"abpo": 0.43, "grpo": 0.25, "ml_retrain": 0.18, "popularity": 0.14}  # the default config's
CTR = {"abpo": 0.05, "grpo": 0.13, "ml_retrain": 0.10, "popularity": 0.08}


def _warehouse(root, users_by_arm, mean_imps=6.0, seed=0):
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import Warehouse

    write_impressions(impressions_log(seed, MONTH, users_by_arm, CTR, mean_imps), root / "landing", MONTH, part="0")
    with Warehouse(root / "warehouse.duckdb") as wh:
        assert wh.ingest_month(root / "landing", MONTH, ARMS).rows_quarantined == 0
    return root


def _cfg(root, **report):
    from abpo.config import Config

    cfg = Config()
    cfg.paths.root = str(root)
    for k, v in report.items():
        setattr(cfg.report, k, v)
    return cfg


def _hashed(n_users, start=1):
    arm_of = assign_users(range(start, start + n_users), "abpo-arms-v1", SHARES)
    return {a: [u for u, b in arm_of.items() if b == a] for a in ARMS}


def test_the_sql_hash_is_the_routers_assignment():
    """sql/report_assignment.sql computes the experiment's hash inside DuckDB: the same arm as assign_arm for every
    user, two salts, the demo's five arms."""
    from abpo.warehouse import Warehouse

    shares = check_shares(
        {"abpo": 0.3, "grpo": 0.3, "ml_retrain": 0.1, "popularity": 0.1, "holdback": 0.2},
        ["abpo", "grpo", "ml_retrain", "popularity", "holdback"],
    )
    users = list(range(-50, 20_000)) + [2**62 + 12345]
    with Warehouse(":memory:") as wh:
        for salt in ("abpo-arms-v1", "abpo-arms-v1/replicate-3"):
            truth = {u: assign_arm(u, salt, shares) for u in users}
            wh.con.execute("DELETE FROM user_month_stats")
            rows = pa.table(
                {
                    "month": [MONTH] * len(users),
                    "arm": [truth[u] for u in users],
                    "user_id": users,
                    "impressions": [1] * len(users),
                    "clicks": [0] * len(users),
                }
            )
            wh.con.register("rows", rows)
            wh.con.execute("INSERT INTO user_month_stats SELECT month, arm, user_id, impressions, clicks FROM rows")
            wh.con.unregister("rows")
            got = wh.run(
                "report_assignment", months=[MONTH], salt=salt, arms=list(shares), bounds=cumulative_bounds(shares)
            ).to_pylist()
            assert sum(r["users"] for r in got if r["period"] == MONTH) == len(users)
            assert [r for r in got if r["misassigned_users"]] == []
            # and under another salt most users are in the wrong arm
            other = wh.run(
                "report_assignment",
                months=[MONTH],
                salt=salt + "x",
                arms=list(shares),
                bounds=cumulative_bounds(shares),
            ).to_pylist()
            wrong = sum(r["misassigned_users"] for r in other if r["period"] == MONTH)
            assert 0.6 * len(users) < wrong < 0.85 * len(users)


def test_one_user_across_every_arm_is_not_called_significant(tmp_path, capsys):
    root = _warehouse(tmp_path / "var", {a: [7] for a in ARMS}, mean_imps=2500)
    rc = main(["report", "--months", MONTH, "--set", f"paths.root={root}", "--no-mlflow"])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    vs_grpo = next(line for line in out if line.startswith("abpo vs grpo:"))
    # one line: the difference, that it is not tested, and why; no z, no p
    assert f"pp, {NOT_TESTED}: abpo: one user carries 100% of its impressions (1 user)" in vs_grpo, vs_grpo
    assert "grpo: one user carries 100% of its impressions (1 user), 1 of its 1 user assigned to another arm" in vs_grpo
    assert "z =" not in vs_grpo and "p <" not in vs_grpo
    assert any(line.startswith("FEW USERS: one user carries more than 10% of an arm's impressions") for line in out)
    mismatch = next(line for line in out if line.startswith("ASSIGNMENT MISMATCH"))
    assert "salt 'abpo-arms-v1'" in mismatch and "(e.g. user 7)" in mismatch
    assert f"abpo: 1 of 1 user in {MONTH}" not in mismatch  # user 7's own arm is the hash's
    assert "users per arm match" not in "\n".join(out)
    assert any(line.startswith("Sample-ratio check inconclusive: too few users (4 in 2026-02") for line in out)
    data = json.loads((root / "reports" / MONTH / "report.json").read_text())
    assert all(c["withheld"] for c in data["comparisons"])
    assert all(c["p_holm"] is None for c in data["comparisons"])  # no test, no Holm-adjusted p
    md = (root / "reports" / MONTH / "report.md").read_text()
    assert "| not tested |" in md and "too few users" in md


def test_a_bot_in_one_arm_withholds_only_that_arms_comparisons(tmp_path):
    by_arm = _hashed(400)
    bot = by_arm["ml_retrain"][0]
    root = _warehouse(tmp_path / "var", by_arm)
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import Warehouse

    # the bot: as many impressions as the rest of ml_retrain together, in its own (hashed) arm
    heavy = impressions_log(5, MONTH, {"ml_retrain": [bot]}, CTR, mean_imps=6.0 * len(by_arm["ml_retrain"]))
    heavy = heavy.set_column(0, "impression_id", pa.array([f"bot-{i}" for i in range(heavy.num_rows)]))
    write_impressions(heavy, root / "landing", MONTH, part="1")
    with Warehouse(root / "warehouse.duckdb") as wh:
        wh.ingest_month(root / "landing", MONTH, ARMS)
    r = build_from_warehouse(_cfg(root, arm_shares=dict(SHARES)), [MONTH])
    by_other = {c.other: c for c in r.comparisons if c.period == ALL}
    assert by_other["ml_retrain"].withheld.startswith("ml_retrain: one user carries")
    assert math_isnan(by_other["ml_retrain"].p_holm)
    assert not by_other["grpo"].withheld and not by_other["popularity"].withheld
    assert by_other["grpo"].test.defined and not math_isnan(by_other["grpo"].p_holm)
    assert [line.split(":")[0] for line in r.flags] == ["FEW USERS"]
    assert "ml_retrain: " in r.flags[0] and "abpo: " not in r.flags[0]
    lines = headline(r)
    assert any(line.startswith("abpo vs grpo: ") and "z = " in line for line in lines)
    assert any(line.startswith("abpo vs ml_retrain: ") and NOT_TESTED in line for line in lines)
    assert srm_verdict(r).startswith("No sample-ratio mismatch")
    # a higher threshold (documented: report.max_user_share) lets it through
    assert not build_from_warehouse(_cfg(root, arm_shares=dict(SHARES), max_user_share=0.9), [MONTH]).flags


def test_users_logged_in_another_arm_are_flagged_by_name(tmp_path):
    by_arm = _hashed(400)
    strays = by_arm["grpo"][:3]  # three grpo users whose rows say abpo
    by_arm = {**by_arm, "grpo": by_arm["grpo"][3:], "abpo": by_arm["abpo"] + strays}
    root = _warehouse(tmp_path / "var", by_arm)
    r = build_from_warehouse(_cfg(root, arm_shares=dict(SHARES)), [MONTH])
    assert [line.split(":")[0] for line in r.flags] == ["ASSIGNMENT MISMATCH"]
    assert f"abpo: 3 of {len(by_arm['abpo'])} users in {MONTH} (e.g. user {min(strays)})" in r.flags[0]
    assert all(c.withheld.startswith("abpo: 3 of its") for c in r.comparisons)  # abpo is in every comparison
    # a router of your own: not checked, and the report says so
    ext = build_from_warehouse(_cfg(root, arm_shares=dict(SHARES), assignment="external"), [MONTH])
    assert not ext.flags and not any(c.withheld for c in ext.comparisons)
    assert any(n.startswith("assignment not checked: report.assignment = external") for n in ext.notes)


def test_the_hashed_assignment_passes_every_check(tmp_path):
    root = _warehouse(tmp_path / "var", _hashed(600))
    r = build_from_warehouse(_cfg(root, arm_shares=dict(SHARES)), [MONTH])
    assert r.flags == [] and not any(c.withheld for c in r.comparisons)
    assert "salt 'abpo-arms-v1'" in r.assignment
    assert srm_verdict(r).startswith("No sample-ratio mismatch")


def test_srm_on_a_handful_of_users_is_inconclusive():
    few = stats.srm_test({"abpo": 1, "grpo": 1, "ml_retrain": 1, "popularity": 1}, SHARES)
    assert few.too_few and not few.mismatch and "too few users to check the split" in few.note
    enough = stats.srm_test({"abpo": 430, "grpo": 250, "ml_retrain": 180, "popularity": 140}, SHARES)
    assert not enough.too_few and not enough.mismatch


def math_isnan(x):
    return x != x


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_max_user_share_is_bounded(share):
    from abpo.config import load_config
    from abpo.config.errors import ConfigError

    with pytest.raises(ConfigError, match="report.max_user_share"):
        load_config("tiny", [f"report.max_user_share={share}"])


class _UniformArm:
    """Exposes a uniformly random candidate, a softmax of equal scores (a cheap stand-in for a served model: what is
    served does not matter here, which user each arm's rows belong to does)."""

    model_version = "1"
    logging_policy = "softmax(tau=1.0)"

    def propensities(self, requests):
        import numpy as np

        return [np.full(len(c), 1.0 / len(c)) for _, _, c in requests]


def test_the_routers_months_pass_the_check_whatever_the_order_and_replicate(make_cfg, movielens):
    """The report checks the rule the simulator's router serves with: the shares in arms.names' order (not
    report.arm_shares'), the replicate's salt. A simulated month, landed and ingested, has no user in a wrong arm."""
    from abpo.abtest.report import build_from_warehouse
    from abpo.data.splits import split_users
    from abpo.sim.simulator import simulate_month
    from abpo.warehouse import Warehouse

    cfg = make_cfg(
        "data.max_users=60",
        "data.update_steps=6",
        "arms.names=popularity,abpo,grpo",
        "report.arm_shares={abpo: 0.5, grpo: 0.3, popularity: 0.2}",
        "sim.replicate=2",
        "policy.tau=1.0",
    )
    splits, _ = split_users(movielens, cfg.data)
    simulate_month(cfg, MONTH, {a: _UniformArm() for a in cfg.arms.names}, dataset=movielens, splits=splits)
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        assert wh.ingest_month(cfg.paths.resolve("landing"), MONTH, cfg.arms.names).rows_quarantined == 0
    r = build_from_warehouse(cfg, [MONTH])
    assert not any(f.startswith("ASSIGNMENT MISMATCH") for f in r.flags), r.flags
    assert "salt 'abpo-arms-v1/replicate-2', shares popularity 0.2, abpo 0.5, grpo 0.3" in r.assignment
    # the same rows judged under the order of report.arm_shares: users in the wrong arm
    cfg.arms.names = ["abpo", "grpo", "popularity"]
    assert any(f.startswith("ASSIGNMENT MISMATCH") for f in build_from_warehouse(cfg, [MONTH]).flags)
