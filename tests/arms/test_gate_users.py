"""The gate on a deployment's own users (issue 20, point 4; config arms.gate_users = warehouse): the held-out users
are a seeded hash slice of the warehouse's users, each scored on their last interaction through the gated month
with candidates drawn by the offline construction's sampler; the update leaves these users' impressions out of
D_bandit; a warehouse that cannot give the gate a user is a message naming it, the month and the rule. Real DuckDB
warehouses with landed interactions and impressions, real MLflow (the tiny models of tests/conftest.py)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from abpo.data.holdout import holdout_unit
from abpo.data.schemas import INTERACTIONS_SCHEMA, SchemaError, write_impressions, write_interactions
from abpo.data.synthetic import synthetic_impressions
from abpo.warehouse import Warehouse
from tests.sizes import TINY_MODEL

M1, M2 = "2026-01", "2026-02"
FRACTION = 0.3


def own_users(n_users: int, n_items: int, seed: int = 0) -> dict[str, dict[int, list[int]]]:
    """month -> user -> the items consumed that month (distinct per user across both months), for users
    1001..1000+n_users (not the dataset's users: a deployment's own); every third user consumes 1 item in M1, the
    rest 2 or 3, and everyone 2 in M2."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[int, list[int]]] = {M1: {}, M2: {}}
    for k in range(n_users):
        u = 1001 + k
        n1 = 1 if k % 3 == 0 else 2 + k % 2
        items = (rng.choice(n_items, size=n1 + 2, replace=False) + 1).tolist()
        out[M1][u], out[M2][u] = items[:n1], items[n1:]
    return out


def land_interactions(cfg, month: str, seqs: dict[int, list[int]], first_position: dict[int, int] | None = None):
    """Land ``seqs`` as the month's interactions (INTERACTIONS_SCHEMA, abpo.data.schemas.write_interactions) and
    ingest them into the config's warehouse; returns the landed file."""
    rows = [(u, i, (first_position or {}).get(u, 0) + p) for u, items in seqs.items() for p, i in enumerate(items)]
    when = datetime(int(month[:4]), int(month[5:]), 2, tzinfo=UTC)
    table = pa.table(
        {
            "user_id": [r[0] for r in rows],
            "item_id": [r[1] for r in rows],
            "event_time": [when] * len(rows),
            "rating": [None] * len(rows),
            "position": [r[2] for r in rows],
        },
        schema=INTERACTIONS_SCHEMA,
    )
    landing = cfg.paths.resolve("landing")
    path = write_interactions(table, landing, month, part="serving")
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        assert wh.ingest_interactions(landing, month) == len(rows)
    return path


def land_both_months(cfg, users):
    land_interactions(cfg, M1, users[M1])
    land_interactions(cfg, M2, users[M2], {u: len(items) for u, items in users[M1].items()})


def warehouse_cfg(make_cfg, movielens_dir, n_items: int, n_users: int, *extra: str):
    """The tiny preset on a synthetic MovieLens catalog of n_items items (the dataset is only the catalog here),
    gating on the warehouse's users."""
    return make_cfg(
        f"data.dataset_dir={movielens_dir(n_items, n_users, ratings_per_user=12)}",
        "data.eval_candidates=10",
        "arms.gate_users=warehouse",
        f"arms.gate_holdout_fraction={FRACTION}",
        *extra,
    )


# ------------------------------------------------------------------------------------------- (a) the gate's users


@pytest.mark.parametrize("n_items,n_users", [(60, 40), (250, 25)])
def test_warehouse_gate_users_are_the_held_out_slice_scored_on_their_last_interaction(
    make_cfg, movielens_dir, n_items, n_users
):
    from abpo.data.candidates import build_eval_examples
    from abpo.data.splits import UserSplit
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.gate_users import gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, n_items, n_users)
    ds, _ = dataset_and_splits(cfg)
    assert len(ds.item_ids()) == n_items
    users = own_users(40, n_items)
    land_both_months(cfg, users)
    seq1 = users[M1]
    seq2 = {u: [*users[M1][u], *users[M2][u]] for u in users[M1]}
    for month, seqs in ((M1, seq1), (M2, seq2)):
        examples, popularity, key = gate_examples(cfg, month)
        expected = sorted(u for u, s in seqs.items() if holdout_unit(cfg.seed, u) < FRACTION and len(s) >= 2)
        assert expected and [e.user_id for e in examples] == expected  # the slice's users with 2+, nobody else
        assert len(expected) < len(seqs)
        for e in examples:
            seq = seqs[e.user_id]
            assert e.positive == seq[-1] and e.history == seq[:-1]  # the last interaction through the month
            assert len(e.candidates) == cfg.data.eval_candidates == len(set(e.candidates))
            assert e.positive in e.candidates
            assert not set(e.candidates) - {e.positive} & set(seq)  # negatives are items the user never consumed
            assert set(e.candidates) <= set(ds.item_ids().tolist())
        # popularity: every user's interactions through the month without the gate's targets (training_popularity's
        # rule), and the candidates are exactly the offline construction's sampler on it
        counts = Counter(i for s in seqs.values() for i in s)
        counts.subtract(seqs[u][-1] for u in expected)
        assert popularity == {i: c for i, c in counts.items() if c > 0}
        splits = [UserSplit(u, seqs[u][:-1], [], seqs[u][-1]) for u in expected]
        assert examples == build_eval_examples(splits, ds, cfg.data, popularity=popularity)
        assert gate_examples(cfg, month) == (examples, popularity, key)  # deterministic
    k1, k2 = gate_examples(cfg, M1)[2], gate_examples(cfg, M2)[2]
    assert k1 != k2  # new targets, new key: the versions' cached metrics are not reused across user sets


def test_gate_max_users_keeps_a_seeded_choice_with_the_same_examples(make_cfg, movielens_dir):
    from abpo.monthly.gate_users import gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    land_both_months(cfg, own_users(40, 60))
    every, _, key = gate_examples(cfg, M2)
    capped = warehouse_cfg(make_cfg, movielens_dir, 60, 40, "arms.gate_max_users=3")
    some, _, key3 = gate_examples(capped, M2)
    assert len(some) == 3 and all(e in every for e in some) and key3 != key
    assert gate_examples(capped, M2)[0] == some


def test_the_key_follows_the_candidates_and_the_landed_data(make_cfg, movielens_dir):
    from abpo.monthly.gate_users import gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    users = own_users(40, 60)
    land_both_months(cfg, users)
    examples, _, key = gate_examples(cfg, M2)
    reseeded, _, key_seed = gate_examples(warehouse_cfg(make_cfg, movielens_dir, 60, 40, "data.seed=1"), M2)
    assert [e.positive for e in reseeded] == [e.positive for e in examples]
    assert [e.candidates for e in reseeded] != [e.candidates for e in examples] and key_seed != key
    # month 2 landed again with one gate user's last item changed: another target, another key
    u = examples[0].user_id
    changed = {**users[M2], u: [users[M2][u][0], next(i for i in range(1, 61) if i not in users[M1][u] + users[M2][u])]}
    land_interactions(cfg, M2, changed, {v: len(items) for v, items in users[M1].items()})
    again, _, key_again = gate_examples(cfg, M2)
    assert again[0].positive == changed[u][-1] and key_again != key


def test_dataset_gate_users_stay_the_offline_construction(make_cfg):
    """arms.gate_users = dataset (the default): the gate's users, popularity and key are what they were, whatever
    month is passed and whatever the warehouse holds. The key is pinned: gate results cached under it (the version's
    gate.eval_key tag, the gate-users dataset's digest) stay found; another seed draws other users, another key."""
    from abpo.data.candidates import build_eval_examples, training_popularity
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.gate_users import dataset_gate_examples, gate_examples
    from abpo.policy.sft import seeded_subsample

    cfg = make_cfg("data.max_users=30", "data.eval_candidates=20")
    assert cfg.arms.gate_users == "dataset" and cfg.arms.gate_holdout_fraction == 0.25
    ds, splits = dataset_and_splits(cfg)
    want = seeded_subsample(build_eval_examples(splits, ds, cfg.data), cfg.sft.eval_max_users, cfg.seed)
    key = "f0b88088b52d"  # this config's users' key as computed before the test stopped copying its code
    assert gate_examples(cfg) == gate_examples(cfg, M1) == dataset_gate_examples(cfg)
    assert gate_examples(cfg) == (want, training_popularity(splits, ds), key)
    assert gate_examples(make_cfg("data.max_users=30", "data.eval_candidates=20", "seed=1"))[2] not in ("", key)


# ----------------------------------------------------------------------------- (b) held out of the update's D_bandit


def land_impressions(cfg, n: int = 600):
    """A month of clean synthetic impressions of every arm (users 1..50) landed and ingested."""
    table, _ = synthetic_impressions(n, M1, seed=3, n_users=50, n_items=100)
    landing = cfg.paths.resolve("landing")
    write_impressions(table, landing, M1, part="serving")
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        wh.ingest_month(landing, M1, cfg.data.known_arms)
    return table


def test_the_update_leaves_the_gate_users_impressions_out_and_logs_how_many(make_cfg, caplog):
    import pyarrow.compute as pc

    from abpo.monthly.update import arm_strata
    from abpo.train.runs import UpdateRun
    from abpo.train.strata import warehouse_strata

    # the arm's own rows (all traffic: tests/monthly/test_update_logs.py); the gate reads every row of the month
    plain = make_cfg("arms.update_logs=own", "arms.gate_ope_rows=all")
    table = land_impressions(plain)
    abpo_rows = table.filter(pc.equal(table.column("arm"), "abpo"))
    slice_ = {u for u in set(table.column("user_id").to_pylist()) if holdout_unit(plain.seed, u) < FRACTION}
    mine = [r for r in abpo_rows.to_pylist() if r["user_id"] in slice_]
    assert mine and len(mine) < abpo_rows.num_rows

    # dataset users and every row to the off-policy half: nothing is left out, the strata are the warehouse's
    pos, neg, held = arm_strata(plain, "abpo", [M1])
    assert held is None and pos.num_rows + neg.num_rows == abpo_rows.num_rows
    with Warehouse(plain.paths.resolve("warehouse"), read_only=True) as wh:
        all_pos, all_neg = wh.strata([M1])
    assert pos.equals(all_pos.filter(pc.equal(all_pos.column("arm"), "abpo")))
    assert neg.equals(all_neg.filter(pc.equal(all_neg.column("arm"), "abpo")))

    # the off-policy half reads the held-out users' rows (heldout), or the offline half scores them (warehouse):
    # either way every row of a held-out user is gone, counted, logged, the same rows
    by_rows = make_cfg(f"arms.gate_holdout_fraction={FRACTION}", "arms.update_logs=own")
    assert by_rows.arms.gate_ope_rows == "heldout"  # the default
    assert by_rows.arms.gate_users == "dataset"
    rows_pos, rows_neg, rows_held = arm_strata(by_rows, "abpo", [M1])
    cfg = make_cfg(
        "arms.gate_users=warehouse",
        f"arms.gate_holdout_fraction={FRACTION}",
        "arms.update_logs=own",
        "arms.gate_ope_rows=all",
    )
    with caplog.at_level("INFO", logger="abpo.train.update"):
        kept_pos, kept_neg, held = arm_strata(cfg, "abpo", [M1])
    assert rows_pos.equals(kept_pos) and rows_neg.equals(kept_neg) and rows_held == held
    kept = set(kept_pos.column("user_id").to_pylist()) | set(kept_neg.column("user_id").to_pylist())
    assert not kept & slice_
    assert kept_pos.num_rows + kept_neg.num_rows == abpo_rows.num_rows - len(mine)
    assert held.rows == len(mine) and held.positive == sum(r["clicked"] for r in mine)
    assert held.users == len({r["user_id"] for r in mine})
    assert (
        f"held out {held.positive} positive + {held.no_response} no-response rows of the gate's users "
        f"({held.users} users"
    ) in caplog.text
    assert kept_pos.equals(pos.filter(pc.invert(pc.is_in(pos.column("user_id"), pa.array(sorted(slice_))))))

    # `abpo update`'s own reader of the warehouse leaves them out too
    w_pos, w_neg, months = warehouse_strata(
        cfg,
        UpdateRun(arm="abpo", months=(M1,)),
        gate_users=cfg.arms.gate_users,
        gate_holdout_fraction=cfg.arms.gate_holdout_fraction,
    )
    assert months == [M1] and w_pos.equals(kept_pos) and w_neg.equals(kept_neg)


def test_the_streamed_batches_and_sizes_leave_the_excluded_users_out(make_cfg):
    cfg = make_cfg()
    land_impressions(cfg, 300)
    with Warehouse(cfg.paths.resolve("warehouse"), read_only=True) as wh:
        users = wh.impression_users([M1])
        out = [u for u in users if holdout_unit(cfg.seed, u) < FRACTION]
        pos, neg = wh.strata([M1], exclude_users=out)
        assert wh.stratum_sizes([M1], exclude_users=out) == (pos.num_rows, neg.num_rows)
        P, N = wh.stratum_sizes([M1])
        counts = wh.held_out_rows([M1], out)
        assert sum(r["positive"] for r in counts) == P - pos.num_rows
        assert sum(r["no_response"] for r in counts) == N - neg.num_rows > 0
        streamed = pa.concat_tables(wh.stratified_batch_stream([M1], 8, seed=1, exclude_users=out))
        assert not set(streamed.column("user_id").to_pylist()) & set(out)
        assert set(streamed.column("impression_id").to_pylist()) == set(pos.column("impression_id").to_pylist()) | set(
            neg.column("impression_id").to_pylist()
        )


# --------------------------------------------------------------------------------------------------- (c) errors


def test_no_warehouse_or_no_interactions_through_the_month_is_a_message(make_cfg, movielens_dir):
    from abpo.cli import expected_errors
    from abpo.monthly.gate_users import GateUsersMissing, gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    path = cfg.paths.resolve("warehouse")
    assert GateUsersMissing in expected_errors()  # the CLI prints it as one line, exit code 2
    with pytest.raises(
        GateUsersMissing,
        match=rf"{path}: no warehouse, so no interactions through month {M1}; "
        r"rule: arms.gate_users=warehouse gates on",
    ):
        gate_examples(cfg, M1)
    land_impressions(cfg, 50)  # impressions, but no interactions at all
    with pytest.raises(
        GateUsersMissing,
        match=rf"{path}: table interactions holds no interactions through month "
        rf"{M1}; rule: .*at least 2 interactions",
    ):
        gate_examples(cfg, M1)
    land_interactions(cfg, M2, own_users(40, 60)[M2])  # only after the gated month
    with pytest.raises(GateUsersMissing, match=f"no interactions through month {M1}"):
        gate_examples(cfg, M1)
    assert gate_examples(cfg, M2)[0]
    with pytest.raises(ValueError, match=r"rule: pass the month"):
        gate_examples(cfg)


def test_no_held_out_user_with_two_interactions_is_a_message(make_cfg, movielens_dir):
    from abpo.monthly.gate_users import GateUsersMissing, gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    users = own_users(40, 60)[M1]
    held = [u for u in users if holdout_unit(cfg.seed, u) < FRACTION]
    land_interactions(cfg, M1, {u: items[:1] if u in held else items for u, items in users.items()})
    with pytest.raises(
        GateUsersMissing,
        match=rf"{cfg.paths.resolve('warehouse')}: through month {M1}, 40 users have "
        rf"interactions, {len(held)} of them in the gate's held-out slice "
        r"\(seed 0\), none with 2 or more; rule: .*"
        r"arms.gate_holdout_fraction=0.3, each with at least 2 interactions",
    ):
        gate_examples(cfg, M1)


def test_an_interaction_of_an_item_outside_the_catalog_is_named_never_dropped(make_cfg, movielens_dir):
    from abpo.monthly.gate_users import gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    users = own_users(40, 60)[M1]
    users[1005] = [*users[1005], 999]  # item 999: the catalog has items 1..60
    path = land_interactions(cfg, M1, users)
    with pytest.raises(
        SchemaError,
        match=rf"{path.absolute()}: interaction of user 1005 at position "
        rf"{len(users[1005]) - 1} \(month {M1}\) has item_id 999, which is not in "
        r"the catalog of the configured dataset \(60 items\); rule: .*1 such "
        r"interaction\(s\) of 1 item\(s\) \(\[999\]\).*none was dropped",
    ):
        gate_examples(cfg, M1)


def test_a_gate_user_without_enough_unseen_items_is_named(make_cfg, movielens_dir):
    from abpo.monthly.gate_users import GateUsersMissing, gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40, "data.eval_candidates=57")  # 56 negatives of 60 items
    users = own_users(40, 60)
    land_both_months(cfg, users)
    seqs = {u: users[M1][u] + users[M2][u] for u in users[M1]}
    crowded = [u for u, s in seqs.items() if holdout_unit(cfg.seed, u) < FRACTION and len(s) == 5]
    assert crowded
    with pytest.raises(
        GateUsersMissing,
        match=rf"gate user {crowded[0]} consumed 5 of the catalog's 60 items through "
        rf"month {M2} \({len(crowded)} gate user\(s\) like this\); rule: "
        r"data.eval_candidates=57 needs 56 items the user never consumed",
    ):
        gate_examples(cfg, M2)


def test_bad_settings_name_the_key_and_the_rule(make_cfg, movielens_dir):
    from abpo.monthly.bootstrap import bootstrap_arms
    from abpo.monthly.gate_users import gate_examples
    from abpo.monthly.update import arm_strata

    # an unknown choice is refused when the config loads (abpo.config: the field's choices), before any step runs
    with pytest.raises(ValueError, match=r"arms.gate_users 'own': rule: one of dataset, warehouse"):
        make_cfg("arms.gate_users=own")
    for bad in ("0", "1.0"):  # refused when the config loads (abpo.config: the field's range) ...
        with pytest.raises(ValueError, match=rf"arms.gate_holdout_fraction {float(bad)}: rule: in \(0, 1\)"):
            make_cfg("arms.gate_users=warehouse", f"arms.gate_holdout_fraction={bad}")
    cfg = make_cfg("arms.gate_users=warehouse")  # ... and again where it is used, for a config changed in code
    cfg.arms.gate_holdout_fraction = 0.0
    with pytest.raises(ValueError, match=r"arms.gate_holdout_fraction=0.0; rule: a share in \(0, 1\)"):
        bootstrap_arms(cfg)
    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40)
    cfg.arms.gate_holdout_fraction = 1.0
    land_interactions(cfg, M1, own_users(40, 60)[M1])
    with pytest.raises(ValueError, match=r"arms.gate_holdout_fraction=1.0; rule: a share in \(0, 1\)"):
        gate_examples(cfg, M1)
    land_impressions(cfg, 50)
    with pytest.raises(ValueError, match=r"arms.gate_holdout_fraction=1.0; rule: a share in \(0, 1\)"):
        arm_strata(cfg, "abpo", [M1])


def test_config_explain_lists_the_new_keys(capsys):
    from abpo.cli import main

    assert main(["config", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "arms.gate_users" in out and "'dataset'" in out and "arms.gate_holdout_fraction" in out
    assert "never enter an LLM" in out


# ------------------------------------------------------------------------------------------ (d) gate, end to end

# a month's held-out users here are fewer than 40: tied, they pass Tango's score test only at a wide margin (n m /
# (1 - m) > 1.96^2); at 0.02 a handful of tied users say nothing
SMALL_MODEL = [*TINY_MODEL, "arms.gate_ope_margin=-1", "arms.gate_margin=0.5"]


def test_gate_arm_scores_both_versions_on_the_warehouse_users(make_cfg, movielens_dir, build_tiny_model):
    """A champion adopted from a tiny model, a challenger (the same weights registered again): the gate scores both on
    the warehouse's held-out users of the month, keeps the metrics on dataset gate-users-v2 with the user set's key as
    digest and each user's rank beside them, and passes (every user tied, margin 0.5); the next month's users are
    another set, scored again, and a cache of the old version or of other users is not read."""
    from abpo import registry as core_registry
    from abpo.arms import versions as arm_versions
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import CHALLENGER, dataset_and_splits, start_run
    from abpo.monthly.gate import GATE_DATASET, gate, kept_ranks, offline_scores, record_offline_metrics
    from abpo.monthly.gate_users import gate_examples

    cfg = warehouse_cfg(make_cfg, movielens_dir, 60, 40, *SMALL_MODEL)
    ds, _ = dataset_and_splits(cfg)
    model_dir = build_tiny_model(cfg.policy, ds.titles())
    champion = adopt_model(cfg, "abpo", model_dir).version
    with start_run(cfg, "challenger", {}) as run:
        uri = arm_versions.log_arm_model(cfg, "abpo", model_dir)
    challenger = str(
        arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, {"source": "test"}, alias=CHALLENGER).version
    )
    land_both_months(cfg, own_users(40, 60))

    examples, _, key = gate_examples(cfg, M1)
    res = gate(cfg, "abpo", challenger, M1)
    assert res.passed and res.champion_version == champion and res.off_policy is None
    assert res.challenger == res.champion and "HR@5" in res.challenger
    for version in (champion, challenger):
        mv = arm_versions.get_version(cfg, "abpo", version)
        assert core_registry.model_metrics(mv, dataset_name=GATE_DATASET, dataset_digest=key) == res.challenger
        assert mv.tags["gate.eval_key"] == key
    # the paired test ran on each user's rank, kept beside the metrics: identical weights tie on every user
    assert (res.offline["n"], res.offline["ties"], res.offline["diff"]) == (len(examples), len(examples), 0.0)
    tags = arm_versions.get_version(cfg, "abpo", challenger).tags
    assert tags["gate.offline.users"] == str(len(examples)) and tags["gate.offline.passed"] == "true"
    assert float(tags["gate.offline.margin"]) == cfg.arms.gate_margin == 0.5
    ranks = kept_ranks(arm_versions.get_version(cfg, "abpo", champion), key, examples)
    assert len(ranks) == len(examples) and ranks == kept_ranks(
        arm_versions.get_version(cfg, "abpo", challenger), key, examples
    )
    assert offline_scores(cfg, "abpo", challenger, M1) == (res.challenger, ranks)  # read back, not rescored
    assert kept_ranks(arm_versions.get_version(cfg, "abpo", champion), "no-such-key", examples) is None
    # month 2: other targets, another user set; the champion is scored on it too (nothing reused across sets). A
    # cache it cannot use is scored again, never misread: the champion's metrics kept under the old dataset name
    # (v1, no ranks), the challenger's metrics with the ranks of other users
    examples2, _, key2 = gate_examples(cfg, M2)
    mv = arm_versions.get_version(cfg, "abpo", champion)
    core_registry.log_model_metrics(mv, {"HR@5": 0.999}, dataset_name="gate-users", dataset_digest=key2)
    record_offline_metrics(
        cfg, "abpo", challenger, {"HR@5": 0.999}, ranks=[1] * len(examples), gate_set=(examples, {}, key2)
    )
    res2 = gate(cfg, "abpo", challenger, M2)
    assert key2 != key and res2.passed and res2.champion["HR@5"] != 0.999 and res2.challenger == res2.champion
    assert res2.offline["n"] == len(examples2) and res2.offline["ties"] == len(examples2)
    assert core_registry.model_metrics(mv, dataset_name=GATE_DATASET, dataset_digest=key2) == res2.champion
    assert arm_versions.get_version(cfg, "abpo", champion).tags["gate.eval_key"] == key2
    assert len(examples) < 40
