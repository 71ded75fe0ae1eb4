"""tests/conftest.py gives a test's new SQLite MLflow store as a copy of one empty store made this session: that store
is the one MLflow itself makes (same schema, same revision, the same Default experiment), and an existing store is
never replaced."""

from __future__ import annotations

import contextlib
import os
import sqlite3


def _clauses(sql: str | None) -> list[str]:
    """A CREATE statement's lines (columns, constraints) in sorted order: MLflow's migrations recreate tables with
    their CHECK constraints in an order that varies from one process to the next (Python's string hashing)."""
    return sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines())


def _dump(db) -> dict:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return {
            "schema": sorted(
                (t, n, _clauses(sql))
                for t, n, sql in con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
            ),
            "revision": con.execute("SELECT * FROM alembic_version").fetchall(),
            "experiments": con.execute(
                "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"
            ).fetchall(),
            "rows": {
                t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608 - table names
                for (t,) in con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                )
            },
        }


def test_a_new_store_from_the_template_is_the_store_mlflow_makes(make_cfg, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from abpo import registry

    monkeypatch.chdir(tmp_path)  # the Default experiment's artifact location follows the working directory
    cfg = make_cfg()
    registry.configure(cfg)
    ours = registry.sqlite_path(cfg.paths.tracking_uri())
    theirs = tmp_path / "mlflow-own.db"  # MLflow's own creation, not through abpo.registry
    uri = f"sqlite:///{theirs}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models(max_results=1)
    assert _dump(ours) == _dump(theirs)
    assert _dump(ours)["experiments"] == [(0, "Default", os.path.join(str(tmp_path), "mlruns", "0"), "active")]
    MlflowClient(tracking_uri=f"sqlite:///{ours}").create_registered_model("kept")


def test_an_existing_store_is_opened_not_replaced(make_cfg):
    from mlflow import MlflowClient

    from abpo import registry

    cfg = make_cfg()
    uri = cfg.paths.tracking_uri()
    registry.sqlite_path(uri).parent.mkdir(parents=True, exist_ok=True)
    MlflowClient(tracking_uri=uri, registry_uri=uri).create_registered_model("already-here")
    registry.configure(cfg)
    assert [m.name for m in MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()] == [
        "already-here"
    ]
