from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

ARMS = ["abpo", "grpo", "ml_retrain", "popularity"]
MONTHS = ["2026-02", "2026-03", "2026-04"]


def synthetic_counts(seed: int = 0, impressions: int = 20_000) -> pa.Table:
    """Counts of a plausible experiment: abpo improving month over month, the others flat."""
    rng = np.random.default_rng(seed)
    base = {"abpo": 0.050, "grpo": 0.047, "ml_retrain": 0.045, "popularity": 0.040}
    rows = {"month": [], "arm": [], "impressions": [], "clicks": [], "users": []}
    for i, m in enumerate(MONTHS):
        for a in ARMS:
            p = base[a] + (0.004 * i if a == "abpo" else 0.0)
            n = int(rng.integers(int(impressions * 0.9), int(impressions * 1.1)))
            rows["month"].append(m)
            rows["arm"].append(a)
            rows["impressions"].append(n)
            rows["clicks"].append(int(rng.binomial(n, p)))
            rows["users"].append(int(rng.binomial(4 * impressions // 10, 0.25)))
    return pa.table(rows)


@pytest.fixture
def counts_table() -> pa.Table:
    return synthetic_counts()


def impressions_log(
    seed: int, month: str, users_by_arm: dict[str, list[int]], ctr_by_arm: dict[str, float], mean_imps: float = 6.0
) -> pa.Table:
    """A month of raw impressions in IMPRESSIONS_SCHEMA: every user of an arm gets Poisson(mean_imps)+1
    impressions with a per-user click rate drawn around the arm's CTR (users differ, as in real logs)."""
    import datetime as dt

    from abpo.data.schemas import IMPRESSIONS_SCHEMA
    from abpo.months import Month

    rng = np.random.default_rng(seed)
    start, _ = Month(month).bounds()
    rows = {f.name: [] for f in IMPRESSIONS_SCHEMA}
    k = 0
    for arm, users in users_by_arm.items():
        for u in users:
            n = int(rng.poisson(mean_imps - 1)) + 1
            q = rng.beta(2.0, 2.0 / max(ctr_by_arm[arm], 1e-6) - 2.0) if ctr_by_arm[arm] > 0 else 0.0
            for _ in range(n):
                t = start + dt.timedelta(seconds=int(rng.integers(0, 27 * 86400)))
                rows["impression_id"].append(f"{month}-{k}")
                rows["event_time"].append(t)
                rows["user_id"].append(u)
                rows["arm"].append(arm)
                rows["model_version"].append(f"{arm}-1")
                rows["history"].append([1, 2, 3])
                rows["candidates"].append([4, 5, 6])
                rows["item_id"].append(5)
                rows["propensity"].append(0.5)
                rows["clicked"].append(int(rng.random() < q))
                rows["request_id"].append(f"r{k}")
                rows["position"].append(0)
                rows["logging_policy"].append("softmax(tau=1.0)")
                rows["served_at"].append(t)
                rows["schema_version"].append(1)
                k += 1
    return pa.table(rows, schema=IMPRESSIONS_SCHEMA)


@pytest.fixture(scope="module")
def warehouse_root(tmp_path_factory):
    """A var/ root with a real DuckDB warehouse holding three ingested months of four arms
    (unequal shares 0.4/0.2/0.2/0.2 of users by the experiment's salted hash under the default sim.salt, the
    router's assignment; a user keeps the arm across months)."""
    from abpo.abtest.assignment import assign_users
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import Warehouse

    root = tmp_path_factory.mktemp("abtest-warehouse") / "var"
    landing = root / "landing"
    users = list(range(1, 801))
    arm_of = assign_users(users, "abpo-arms-v1", {"abpo": 0.4, "grpo": 0.2, "ml_retrain": 0.2, "popularity": 0.2})
    ctr = {"abpo": 0.12, "grpo": 0.10, "ml_retrain": 0.10, "popularity": 0.08}
    with Warehouse(root / "warehouse.duckdb") as wh:
        for i, m in enumerate(MONTHS):
            back = np.random.default_rng(100 + i).random(len(users)) > 0.2  # not every user comes back
            active = [u for u, b in zip(users, back) if b]
            by_arm = {a: [u for u in active if arm_of[u] == a] for a in ARMS}
            write_impressions(impressions_log(i, m, by_arm, ctr), landing, m, part="0")
            rep = wh.ingest_month(landing, m, ARMS)
            assert rep.rows_quarantined == 0, str(rep)
    return root
