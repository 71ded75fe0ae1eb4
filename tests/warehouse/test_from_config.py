"""abpo.warehouse.from_config's synthetic month (what `abpo data synth` lands to try the ingest on) and the months a
warehouse knows (what `abpo data rebuild-aggregates` rebuilds by default). Real DuckDB and Parquet."""

from __future__ import annotations

import pyarrow.parquet as pq

from abpo.warehouse import Warehouse, config_catalog, ingest_with_config, land_synthetic


def test_a_synthetic_month_lands_over_the_configs_catalog_with_its_violations(make_cfg, tmp_path):
    cfg = make_cfg()
    rows, path, injected = land_synthetic(cfg, "2025-02", 400, 0.05)
    assert str(path).startswith(str(cfg.paths.location("landing"))) and "month=2025-02" in str(path)
    table = pq.read_table(path)
    assert rows == table.num_rows == 400 and sum(injected.values()) == 20  # 5 % of the rows break one rule
    assert set(cfg.data.known_arms) & set(table.column("arm").to_pylist())
    elsewhere = tmp_path / "elsewhere"
    rows, path, injected = land_synthetic(cfg, "2025-03", 50, 0.0, str(elsewhere))
    assert str(path).startswith(str(elsewhere)) and rows == 50 and not injected
    items = set(pq.read_table(path).column("item_id").to_pylist())
    assert items <= set(config_catalog(cfg))  # every item is the dataset's (the ingest checks it)


def test_the_known_months_are_those_with_clean_rows_or_an_ingest_run(make_cfg):
    cfg = make_cfg()
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        assert wh.known_months() == []
    land_synthetic(cfg, "2025-03", 200, 0.0)
    land_synthetic(cfg, "2025-02", 200, 0.0)
    for month in ("2025-03", "2025-02"):
        ingest_with_config(cfg, month, validate=False)
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        assert wh.known_months() == ["2025-02", "2025-03"]
