"""A full disk or a damaged mlflow.db is one line naming the file and the rule, fails at once (a refusal: the DAG's
tasks do not retry it) and leaves no run RUNNING. Before, "database or disk is full" while the update's run ended
left that run RUNNING, while logging the model it ended FAILED, and both were retried; an mlflow.db truncated to half
was a SQLAlchemy "malformed" traceback read as transient, and a corrupted page went unnoticed through a month. The
faults are injected at the named call (SQLite's words as MLflow's SQLAlchemy store raises them), on a real store;
the damaged files are real ones (truncated, a page overwritten), found by PRAGMA quick_check where the store opens."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from abpo import registry
from abpo.config import load_config


def _disk_full(statement: str = "UPDATE runs SET status=?"):
    """What MLflow's SQLAlchemy store raises when SQLite cannot grow the file."""
    import sqlalchemy.exc

    return sqlalchemy.exc.OperationalError(statement, {}, sqlite3.OperationalError("database or disk is full"))


def _store(state):
    cfg = load_config("tiny")
    registry.configure(cfg)
    return cfg, state / "mlflow.db"


def _reopened() -> None:
    """As in a new process: the store is opened (and checked) again by the next registry call."""
    from abpo.registry import store

    store._initialised.clear()
    store._configured.clear()


def _status(run_id: str) -> str:
    from mlflow import MlflowClient

    return MlflowClient().get_run(run_id).info.status


def test_a_full_disk_while_a_run_ends_is_one_line_and_the_run_is_not_left_running(state, monkeypatch):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from abpo.monthly.common import retry_or_fail

    cfg, db = _store(state)
    real = SqlAlchemyStore.update_run_info
    failed = []

    def full_once(self, run_id, *args, **kwargs):  # the end of the run is the write the full disk refuses
        if not failed:
            failed.append(run_id)
            raise _disk_full()
        return real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "update_run_info", full_once)
    with pytest.raises(registry.StoreFull) as info:
        with registry.start_run(cfg, "abpo-update", "update-x") as run:
            pass
    said = str(info.value)
    assert f"{db}: the MLflow store cannot be written: database or disk is full" in said, said
    assert "rule: free space on the disk that holds it" in said and "\n" not in said
    assert f"run {run.info.run_id} marked FAILED" in said
    assert failed == [run.info.run_id] and _status(run.info.run_id) == "FAILED"  # not left RUNNING
    assert retry_or_fail(info.value) == "fail"
    assert retry_or_fail(info.value.__cause__) == "fail"  # SQLAlchemy's own error, however it reaches the task


def test_a_full_disk_while_logging_into_a_resumed_run_is_one_line_and_fails_at_once(state, tmp_path):
    from abpo.monthly.common import retry_or_fail

    cfg, _ = _store(state)
    with registry.start_run(cfg, "abpo-update", "update-x") as run:
        pass
    target = tmp_path / "mlartifacts" / "model.safetensors"
    with pytest.raises(registry.StoreFull) as info:
        with registry.resume_run(cfg, run.info.run_id):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))  # the model's copy
    said = str(info.value)
    assert said.startswith(f"{target}: no space left on device; rule: free space") and "\n" not in said, said
    assert _status(run.info.run_id) == "FAILED" and retry_or_fail(info.value) == "fail"


def test_a_store_that_takes_no_write_at_all_says_the_run_is_left_for_the_next_attempt(state, monkeypatch):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    cfg, _ = _store(state)

    def always_full(self, *args, **kwargs):
        raise _disk_full()

    monkeypatch.setattr(SqlAlchemyStore, "update_run_info", always_full)
    with pytest.raises(registry.StoreFull, match="could not be marked FAILED either: the task's next attempt marks"):
        with registry.start_run(cfg, "abpo-update", "update-x"):
            pass


@pytest.mark.parametrize("damage", ["truncated", "page"])
def test_a_damaged_store_is_refused_where_it_is_opened_naming_the_file_and_the_rule(state, abpo, damage):
    from abpo.monthly.common import retry_or_fail

    cfg, db = _store(state)
    with registry.start_run(cfg, "abpo-arms", "a-month") as run:  # a store with something in it
        registry.set_tags({f"t{i}": "x" * 200 for i in range(200)})
    with sqlite3.connect(db) as con:
        page = con.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(db.read_bytes())
    if damage == "truncated":
        db.write_bytes(bytes(data[: len(data) // 2]))
    else:  # one b-tree page in the middle overwritten: SQLite opens the file, reads of that page are wrong
        middle = (len(data) // page // 2) * page
        data[middle : middle + page] = b"\xa5" * page
        db.write_bytes(bytes(data))
    _reopened()
    with pytest.raises(registry.StoreDamaged) as info:
        registry.get_version(registry.CHAMPION, cfg=cfg)
    said = str(info.value)
    assert said.startswith(f"{db}: the store cannot be opened: the MLflow store is damaged (") and "\n" not in said, (
        said
    )
    assert "rule: a damaged store is restored from a backup" in said and "not retried" in said
    assert isinstance(info.value, registry.RegistryUnavailable)  # never read as "no champion"
    assert retry_or_fail(info.value) == "fail"
    _reopened()
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and "the store cannot be opened: the MLflow store is damaged" in err and "Traceback" not in err, err
    assert run.info.run_id  # the run existed before the damage


def test_sqlites_malformed_error_from_anywhere_is_a_refusal_not_a_retry(state):
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    from abpo.monthly.common import retry_or_fail

    _store(state)
    malformed = sqlalchemy.exc.DatabaseError("SELECT", {}, sqlite3.DatabaseError("database disk image is malformed"))
    try:
        try:
            raise malformed
        except Exception as e:
            raise MlflowException(f"(sqlite3.DatabaseError) database disk image is malformed {e}") from e
    except MlflowException as wrapped:
        try:
            raise registry.RegistryUnavailable("MLflow registry: could not read alias 'champion'") from wrapped
        except registry.RegistryUnavailable as top:
            assert retry_or_fail(top) == "fail"  # RegistryUnavailable alone would be retried
            said = registry.store_failure(top)
    assert isinstance(said, registry.StoreDamaged) and str(said).startswith(str(state / "mlflow.db"))
    assert retry_or_fail(registry.RegistryUnavailable("server down")) == "retry"  # a plain outage still retries
