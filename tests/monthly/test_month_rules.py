"""Issue 32, items 2 and 9, by the routes a user takes (the `abpo` command in-process, the steps the DAG's tasks and
`abpo arms month` run): a state with completed months whose MLflow store lost the arms (a missing or zero-byte
mlflow.db, a store holding none of the arms' models) is refused, never bootstrapped again silently; a month older
than the last completed month and never ingested is refused unless forced. Real DuckDB, Great Expectations and
MLflow (SQLite); the completed months are ingested and reported as the cycle does, without models."""

from __future__ import annotations

import pytest

from abpo.config import load_config
from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions


def land(cfg, month: str, seed: int = 3) -> None:
    from abpo.warehouse import config_catalog

    catalog = config_catalog(cfg)  # items in the dataset: the ingest quarantines others (item_not_in_catalog)
    table, _ = synthetic_impressions(
        300, month, seed=seed, violation_rate=0.0, n_users=100, item_ids=catalog, n_items=min(5_000, len(catalog))
    )
    write_impressions(table, cfg.paths.resolve("landing"), month, part="sim")


def complete(cfg, *months: str) -> None:
    """Each month landed, ingested and reported: the cycle's last step marks it complete."""
    from abpo.monthly.report import report
    from abpo.warehouse import ingest_with_config

    for month in months:
        land(cfg, month)
        ingest_with_config(cfg, month)
        report(cfg, month)


def one_line_refusal(rc: int, err: str) -> str:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# ----------------------------------------------------------------------------------------------- item 2: the registry
@pytest.mark.parametrize("store", ["missing", "zero-byte"])
def test_a_lost_mlflow_db_is_refused_by_status_and_by_the_month_never_rebootstrapped(state, abpo, store):
    cfg = load_config("tiny")
    complete(cfg, "2026-01", "2026-02")
    db = state / "mlflow.db"
    db.unlink(missing_ok=True)
    if store == "zero-byte":
        db.write_bytes(b"")
    err = one_line_refusal(*abpo("arms", "status")[::2])
    assert f"{db}: the MLflow store is {'missing' if store == 'missing' else 'empty (0 bytes)'}" in err
    assert "registry_matches_state" in err and "2 completed month(s) (2026-01..2026-02)" in err
    assert "abpo arms bootstrap" in err and "abpo arms month --force" in err
    from abpo.monthly.bootstrap import RegistryLost, bootstrap
    from abpo.monthly.common import retry_or_fail

    # the month (the DAG's bootstrap task and `abpo arms month` run this step first): refused before anything
    with pytest.raises(RegistryLost, match="registry_matches_state") as info:
        bootstrap(cfg, "2026-03")
    assert retry_or_fail(info.value) == "fail"  # a refusal: the DAG fails the task at once, no retry
    err = one_line_refusal(*abpo("arms", "month", "--month", "2026-03", "--simulate")[::2])
    assert "registry_matches_state" in err
    assert (db.exists(), db.stat().st_size if db.exists() else 0) == (store == "zero-byte", 0)  # never created
    assert not (state / "models").exists() and not (state / "landing" / "impressions" / "month=2026-03").exists()


def test_a_store_with_none_of_the_arms_models_is_refused_and_a_fresh_state_is_not(state, abpo):
    from mlflow import MlflowClient

    from abpo import registry

    cfg = load_config("tiny")
    assert abpo("arms", "status")[0] == 0  # a fresh state (no completed month): no champions yet, nothing refused
    complete(cfg, "2026-01")
    registry.configure(cfg)
    MlflowClient().create_registered_model("someone-elses-model")  # a store, but none of the arms' models
    err = one_line_refusal(*abpo("arms", "status")[::2])
    assert "MLflow store sqlite:///" in err and "holds none of the arms' registered models (abpo-arm-abpo" in err
    assert "registry_matches_state" in err
    from abpo.monthly.bootstrap import require_registry

    require_registry(cfg, force=True)  # --force: starting over on purpose
    MlflowClient().create_registered_model("abpo-arm-abpo")  # one arm's model: the store is the state's
    rc, out, _ = abpo("arms", "status")
    assert rc == 0 and "abpo-arm-abpo" in out


# ------------------------------------------------------------------------------------------- a lost warehouse
@pytest.mark.parametrize("lost", ["missing", "zero-byte"])
def test_a_lost_warehouse_of_a_state_with_completed_months_is_refused_never_recreated(state, abpo, lost):
    """The warehouse of a completed month deleted: `abpo arms month` exited 0 on a new, empty warehouse, the month's
    impressions and its place in the report gone without a word. Refused as a lost mlflow.db is."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.monthly.bootstrap import bootstrap
    from abpo.monthly.common import retry_or_fail
    from abpo.warehouse import WarehouseLost, open_warehouse

    cfg = load_config("tiny")
    complete(cfg, "2026-01")
    registry.configure(cfg)
    MlflowClient().create_registered_model("abpo-arm-abpo")  # the registry is the state's: only the warehouse is lost
    house = cfg.paths.resolve("warehouse")
    house.unlink()
    if lost == "zero-byte":
        house.write_bytes(b"")
    says = f"{house}: the warehouse is {'missing' if lost == 'missing' else 'empty (0 bytes)'}"
    with pytest.raises(WarehouseLost, match="warehouse_matches_state") as info:
        bootstrap(cfg, "2026-02")  # the month's first step (the DAG's bootstrap task, `abpo arms month`)
    assert retry_or_fail(info.value) == "fail"  # a refusal: the DAG fails the task at once, no retry
    for argv in (("arms", "month", "--month", "2026-02", "--simulate"), ("ingest", "--month", "2026-02")):
        err = abpo(*argv)[2]
        assert says in err and "1 month(s) recorded (2026-01" in err and "warehouse_matches_state" in err, err
        assert "restore the file" in err and "fresh state" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    with pytest.raises(WarehouseLost):
        open_warehouse(cfg)  # any writer: the root of the refusal
    assert (house.exists(), house.stat().st_size if house.exists() else 0) == (lost == "zero-byte", 0)  # not made


def test_a_warehouse_lost_with_the_cycle_records_is_refused_by_the_registrys_months(state, abpo):
    """The registry's champion was trained on recorded months (its lineage tag ``months``): the state needs their
    warehouse even when the cycle records went with it."""
    import shutil

    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.monthly.bootstrap import bootstrap
    from abpo.warehouse import WarehouseLost

    cfg = load_config("tiny")
    registry.configure(cfg)
    name = arm_versions.model_name("abpo", cfg)
    MlflowClient().create_registered_model(name)
    mv = MlflowClient().create_model_version(name, source=str(state), tags={"months": "2025-12,2026-01"})
    MlflowClient().set_registered_model_alias(name, "champion", mv.version)
    shutil.rmtree(state / "cycle", ignore_errors=True)
    with pytest.raises(WarehouseLost, match=r"2 month\(s\) recorded \(2025-12\.\.2026-01.*registry"):
        bootstrap(cfg, "2026-02")
    assert not cfg.paths.resolve("warehouse").exists()


def test_a_fresh_state_creates_its_warehouse(state, abpo):
    from abpo.warehouse import open_warehouse

    cfg = load_config("tiny")
    with open_warehouse(cfg) as wh:  # no month recorded: nothing to lose
        assert wh.months() == []
    assert cfg.paths.resolve("warehouse").is_file()


# ------------------------------------------------------------------------------------------- item 9: months in order
def test_an_ingest_older_than_the_last_completed_month_is_refused_unless_forced(state, abpo):
    from abpo.warehouse import open_warehouse

    cfg = load_config("tiny")
    complete(cfg, "2026-01", "2026-02")
    land(cfg, "2025-12", seed=5)

    def months():
        with open_warehouse(cfg, read_only=True) as wh:
            return wh.months()

    err = one_line_refusal(*abpo("ingest", "--month", "2025-12")[::2])
    assert "abpo ingest: month 2025-12: older than the last completed month 2026-02" in err
    assert "months_in_order" in err and "--force-month-order" in err
    assert months() == ["2026-01", "2026-02"]
    from abpo.monthly.common import retry_or_fail
    from abpo.monthly.ingest import ingest
    from abpo.monthly.report import MonthOutOfOrder, require_previous_month

    with pytest.raises(MonthOutOfOrder, match="months_in_order") as info:  # the DAG's ingest task / run_month's step
        ingest(cfg, "2025-12")
    assert retry_or_fail(info.value) == "fail" and months() == ["2026-01", "2026-02"]
    require_previous_month(cfg, "2026-03")  # nothing was left behind to block the next month
    # a month in order, or a completed month again, is not this rule's business
    land(cfg, "2026-03")
    assert abpo("ingest", "--month", "2026-03")[0] == 0
    assert abpo("ingest", "--month", "2026-02")[0] == 0
    # forced: the backfill is ingested (and its cycle may then run: the rule lets an ingested month through)
    rc, out, err = abpo("ingest", "--month", "2025-12", "--force-month-order")
    assert rc == 0, err
    assert months() == ["2025-12", "2026-01", "2026-02", "2026-03"]
    from abpo.monthly.report import require_month_order

    require_month_order(cfg, "2025-12")


def test_an_update_size_for_a_ranker_is_refused_at_the_update_step(tmp_path):
    """arms.update_max_examples_by_arm may only size LLM arms: the config's rule (served arms) cannot know the
    kinds, the update step does, and refuses before it reads any state."""
    import pytest

    from abpo.config import load_config
    from abpo.monthly.update import update

    cfg = load_config("tiny", [f"paths.root={tmp_path}", "arms.update_max_examples_by_arm={popularity: 64}"])
    with pytest.raises(ValueError, match=r"update_max_examples_by_arm names \['popularity'\], not LLM arms.*rule:"):
        update(cfg, "abpo", "2026-01")
