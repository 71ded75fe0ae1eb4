"""policy.tau at its floor (abpo.config.policy.TAU_MIN, 1e-3) is accepted, and there the logging policy is
near-deterministic: the served item's e0 is within 1e-6 of 1 on nearly every request, so the off-policy gate has no
support beyond the served items. The floor stays numeric (how small a tau is degenerate depends on the model's score
gaps, which the config cannot see); the ingest measures the month's clean rows instead and warns, in one line naming
the month, the arms, their shares, the tau in use and the rule. Rows with one candidate (e0 = 1 at any tau) do not
count, and a month at or below the share is not warned about. Real DuckDB, by the route a user takes (`abpo
ingest`)."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import torch

from abpo.config.policy import TAU_MIN
from abpo.policy.scoring import candidate_propensities, sample_logged_action
from abpo.warehouse import Warehouse
from abpo.warehouse.ingest import NEAR_DETERMINISTIC_RULE, NEAR_ONE_PROPENSITY
from tests.landed_impressions import MONTH, clean_table, land


def _served_near_one(tau: float, n: int = 200) -> float:
    """The share of ``n`` requests (20 candidates whose mean log-probs spread as a trained policy's do, sd 0.5 nats)
    whose served item, drawn from softmax(s / tau) as abpo.policy.bandit logs it, has e0 >= NEAR_ONE_PROPENSITY."""
    rng = np.random.default_rng(0)
    near = 0
    for _ in range(n):
        scores = torch.tensor(rng.normal(-4.0, 0.5, size=20), dtype=torch.float32)
        _, p = sample_logged_action(candidate_propensities(scores, tau).numpy(), rng)
        near += p >= NEAR_ONE_PROPENSITY
    return near / n


def test_at_the_smallest_accepted_tau_the_served_items_propensity_is_one():
    assert _served_near_one(TAU_MIN) > 0.9
    assert _served_near_one(1.0) == 0.0


def _logged(table: pa.Table, arms: dict[str, float], tau: float = TAU_MIN) -> pa.Table:
    """``table`` with the rows of each arm in ``arms``: the first share ``arms[arm]`` of them logged with propensity
    1.0 under softmax(tau=``tau``), the rest with their own propensity under that rule; the other arms' rows under
    a ranker's rule (softmax(score/T, T=1.0) <arm>), with their own propensities."""
    arm_of = table.column("arm").to_pylist()
    prop = table.column("propensity").to_pylist()
    policy = table.column("logging_policy").to_pylist()
    seen: dict[str, list[int]] = {}
    for i, a in enumerate(arm_of):
        seen.setdefault(a, []).append(i)
        policy[i] = f"softmax(score/T, T=1.0) {a}"
    for arm, share in arms.items():
        rows = seen[arm]
        for k, i in enumerate(rows):
            policy[i] = f"softmax(tau={tau})"
            if k < share * len(rows):
                prop[i] = 1.0
    table = table.set_column(table.schema.get_field_index("propensity"), "propensity", pa.array(prop, pa.float64()))
    return table.set_column(table.schema.get_field_index("logging_policy"), "logging_policy", pa.array(policy))


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "near-deterministic logging" in r.getMessage()
    ]


def test_a_month_logged_near_deterministically_is_warned_about(abpo, state, caplog):
    land(state, _logged(clean_table(80), {"abpo": 1.0, "grpo": 1.0}))
    with caplog.at_level(logging.WARNING, logger="abpo.warehouse"):
        rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", f"policy.tau={TAU_MIN}")
    assert rc == 0, err
    (line,) = _warnings(caplog)
    assert line.startswith(f"ingest {MONTH}: near-deterministic logging: propensity >= 1 - 1e-06 on "), line
    for arm in ("abpo", "grpo"):
        assert f"rows of arm {arm} (100.0%, softmax(tau=0.001))" in line, line
    assert "ml_retrain" not in line and "popularity" not in line  # their rows are stochastic
    assert "policy.tau = 0.001" in line and f"rule: {NEAR_DETERMINISTIC_RULE}" in line, line
    assert line.endswith("(warned above 50% of an arm's rows); raise policy.tau"), line
    assert "near-deterministic logging (propensity >= 1 - 1e-06): abpo 100.0%, grpo 100.0%" in out  # the report
    import duckdb

    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:  # a warning, not a refusal
        assert con.execute("SELECT count(*) FROM impressions").fetchall() == [(80,)]


def test_one_candidate_rows_and_a_month_at_the_share_are_not_warned_about(tmp_path, caplog):
    t = _logged(clean_table(80), {"abpo": 1.0, "grpo": 0.5})  # grpo: half its rows, not over half
    arm_of = t.column("arm").to_pylist()
    cands = t.column("candidates").to_pylist()
    items = t.column("item_id").to_pylist()
    one = [[items[i]] if a == "abpo" else c for i, (a, c) in enumerate(zip(arm_of, cands, strict=True))]
    t = t.set_column(
        t.schema.get_field_index("candidates"), "candidates", pa.array(one, t.schema.field("candidates").type)
    )
    land(tmp_path, t)  # abpo: every row has one candidate (e0 = 1 whatever tau)
    with Warehouse(tmp_path / "wh.duckdb") as wh, caplog.at_level(logging.WARNING, logger="abpo.warehouse"):
        report = wh.ingest_month(
            tmp_path / "landing", MONTH, ["abpo", "grpo", "ml_retrain", "popularity"], policy_tau=TAU_MIN
        )
    assert report.rows_clean == 80 and report.near_deterministic == {} and _warnings(caplog) == []
