"""Object storage as strict as the local landing (issue 48, item 5), against a real S3 API (moto's server, fixture
``s3``): objects under a sub-prefix of the month are refused, not skipped (200 rows were lost); a scheduled run during
an upload (objects, no _SUCCESS) finds the month incomplete and skips it instead of failing it; an endpoint that is
down is transient (retried) while a deterministic DuckDB error is a refusal (retry classes were inverted)."""

from __future__ import annotations

import socket

import duckdb
import pytest

from tests.data.test_storage import _table


def test_objects_under_a_sub_prefix_are_refused_not_skipped(s3, tmp_path):
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import IngestError, Warehouse

    landing = f"s3://{s3.bucket}/landing"
    table = _table()
    write_impressions(table, landing, "2026-01", part="a")
    body = s3.client.get_object(Bucket=s3.bucket, Key="landing/impressions/month=2026-01/part-a.parquet")["Body"]
    s3.client.put_object(
        Bucket=s3.bucket, Key="landing/impressions/month=2026-01/late/part-b.parquet", Body=body.read()
    )
    with Warehouse(tmp_path / "w.duckdb") as wh:
        with pytest.raises(IngestError, match=r"month=2026-01/late/: a sub-prefix in the landing partition") as e:
            wh.ingest_month(landing, "2026-01", sorted(set(table.column("arm").to_pylist())))
        assert "\n" not in str(e.value) and "move them up" in str(e.value)
        assert wh.con.sql("SELECT count(*) FROM impressions").fetchall() == [(0,)]


def test_a_scheduled_look_during_an_upload_finds_the_month_incomplete(s3, make_cfg, monkeypatch):
    from abpo.data.schemas import write_impressions
    from abpo.monthly.common import landing_status

    monkeypatch.delenv("ABPO_LANDING_MARKER", raising=False)
    cfg = make_cfg(f"paths.landing=s3://{s3.bucket}/landing")
    write_impressions(_table(), cfg.paths.location("landing"), "2026-01", part="a")
    s3.client.delete_object(Bucket=s3.bucket, Key="landing/impressions/month=2026-01/_SUCCESS")  # still uploading
    ok, found = landing_status(cfg, "2026-01")  # the scheduled run's look: no marker asked for, the ingest's applies
    assert not ok and found.endswith("1 object(s), but no _SUCCESS marker yet (the ingestion has not finished)")
    s3.client.put_object(Bucket=s3.bucket, Key="landing/impressions/month=2026-01/_SUCCESS", Body=b"")
    assert landing_status(cfg, "2026-01")[0]


def test_an_endpoint_that_is_down_is_transient_and_one_line(s3, tmp_path, monkeypatch, abpo, state):
    from abpo.data import storage
    from abpo.monthly.common import retry_or_fail
    from abpo.warehouse import Warehouse

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with Warehouse(tmp_path / "w.duckdb") as wh:
        with pytest.raises(storage.StorageUnavailable) as e:
            wh.ingest_month(f"s3://{s3.bucket}/landing", "2026-01", ["abpo"])
    assert retry_or_fail(e.value) == "retry" and "\n" not in str(e.value)
    rc, out, err = abpo("ingest", "--month", "2026-01", "--set", f"paths.landing=s3://{s3.bucket}/landing")
    assert rc == 2 and "Traceback" not in err and "listing failed" in err, err


def test_a_deterministic_duckdb_error_in_an_ingest_step_is_a_refusal(tmp_path, monkeypatch):
    """A binder error (what a changed column type gives) fails the same way on every try: IngestError (refused),
    where a disk or database failure stays IngestStepFailed (retried)."""
    from abpo.data.schemas import write_impressions
    from abpo.monthly.common import retry_or_fail
    from abpo.warehouse import IngestError, IngestStepFailed, SQLFileError, Warehouse

    table = _table()
    write_impressions(table, tmp_path / "landing", "2026-01", part="a")
    run = Warehouse.run

    def failing(kind):
        def fail(self, name, **params):
            if name == "ingest_check":
                try:
                    raise kind("Binder Error: Cannot compare values of type VARCHAR and type BIGINT")
                except duckdb.Error as e:
                    raise SQLFileError(f"sql/ingest_check.sql: {type(e).__name__}: {e}") from e
            return run(self, name, **params)

        return fail

    arms = sorted(set(table.column("arm").to_pylist()))
    monkeypatch.setattr(Warehouse, "run", failing(duckdb.BinderException))
    with Warehouse(tmp_path / "w.duckdb") as wh:
        with pytest.raises(IngestError) as e:
            wh.ingest_month(tmp_path / "landing", "2026-01", arms)
    assert not isinstance(e.value, IngestStepFailed) and retry_or_fail(e.value) == "fail"
    assert "a changed column type fails the same way on every try" in str(e.value)
    monkeypatch.setattr(Warehouse, "run", failing(duckdb.IOException))
    with Warehouse(tmp_path / "w2.duckdb") as wh:
        with pytest.raises(IngestStepFailed) as e2:
            wh.ingest_month(tmp_path / "landing", "2026-01", arms)
    assert retry_or_fail(e2.value) == "retry"
