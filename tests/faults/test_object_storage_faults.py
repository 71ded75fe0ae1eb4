"""Object storage as strict as the local landing (issue 48, item 5), against a real S3 API (moto's server, fixture
``s3``): objects under a sub-prefix of the month are refused, not skipped (200 rows were lost); a scheduled run during
an upload (objects, no _SUCCESS) finds the month incomplete and skips it instead of failing it; an endpoint that is
down is transient (retried) while a deterministic DuckDB error is a refusal (retry classes were inverted)."""

from __future__ import annotations

import socket

import duckdb
import pytest

from tests.landed_impressions import synthetic_table


def test_objects_under_a_sub_prefix_are_refused_not_skipped(s3, tmp_path):
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import IngestError, Warehouse

    landing = f"s3://{s3.bucket}/landing"
    table = synthetic_table()
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
    write_impressions(synthetic_table(), cfg.paths.location("landing"), "2026-01", part="a")
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

    table = synthetic_table()
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


def test_an_object_rewritten_after_its_check_is_not_ingested(s3, tmp_path, monkeypatch):
    """The schema check reads each object's footer; an object rewritten (here with another schema) before the copy
    was ingested. The staged bytes are now checked again, and a copy is pinned by size and last-modified time."""
    import pyarrow as pa

    from abpo.data import storage
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import IngestError, Warehouse

    landing = f"s3://{s3.bucket}/landing"
    table = synthetic_table()
    write_impressions(table, landing, "2026-01", part="a")
    key = "landing/impressions/month=2026-01/part-a.parquet"
    download = storage.download

    def rewrite_then_download(uris, directory, **kw):  # the producer rewrites the object between check and copy
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table.drop_columns(["propensity"]).append_column("propensity", pa.array(["x"] * 60)), buf)
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=buf.getvalue())
        return download(uris, directory, **kw)

    monkeypatch.setattr(storage, "download", rewrite_then_download)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        with pytest.raises(IngestError, match=r"part-a.parquet: wrong schema \(rewritten after it was checked\)"):
            wh.ingest_month(landing, "2026-01", sorted(set(table.column("arm").to_pylist())))
        assert wh.con.sql("SELECT count(*) FROM impressions").fetchall() == [(0,)]


def test_a_copy_is_pinned_to_one_version_of_its_object(s3, tmp_path, monkeypatch):
    from abpo.data import storage
    from abpo.data.schemas import write_impressions

    landing = f"s3://{s3.bucket}/landing"
    uri = write_impressions(synthetic_table(), landing, "2026-01", part="a")
    key = "landing/impressions/month=2026-01/part-a.parquet"
    stat = storage.stat
    calls = []

    def stat_then_rewrite(u):  # the object is rewritten (other bytes, other size) right after its first stat
        got = stat(u)
        calls.append(u)
        if len(calls) == 1:
            s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b"PAR1" + b"\0" * 100 + b"PAR1")
        return got

    monkeypatch.setattr(storage, "stat", stat_then_rewrite)
    with pytest.raises(storage.StorageError, match="changed while it was copied"):
        storage.download([uri], tmp_path)


def test_many_objects_are_copied_concurrently_and_warned_about(s3, tmp_path, monkeypatch, caplog):
    import logging

    from abpo.data import storage
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import Warehouse, ingest

    landing = f"s3://{s3.bucket}/landing"
    tables = [synthetic_table(n=2, seed=k) for k in range(12)]
    for k, t in enumerate(tables):  # (ids repeated across seeds are quarantined as duplicates: force publishes)
        write_impressions(t, landing, "2026-01", part=f"p{k:03d}")
    monkeypatch.setattr(ingest, "MANY_OBJECTS", 10)
    threads = set()
    one = storage._download_one

    def record(uri, dest):
        import threading

        threads.add(threading.get_ident())
        one(uri, dest)

    monkeypatch.setattr(storage, "_download_one", record)
    caplog.set_level(logging.WARNING, logger="abpo.warehouse")
    arms = sorted({a for t in tables for a in t.column("arm").to_pylist()})
    with Warehouse(tmp_path / "w.duckdb") as wh:
        report = wh.ingest_month(landing, "2026-01", arms, force=True)
    assert len(report.files) == 12 and len(threads) > 1
    assert any("12 objects in the month's partition: copied 8 at a time" in r.getMessage() for r in caplog.records)


def _aws_resolves() -> bool:
    try:
        socket.getaddrinfo("s3.us-east-1.amazonaws.com", 443)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("where", ["endpoint", "region lookup"])
def test_an_endpoint_that_does_not_resolve_is_one_line(tmp_path, monkeypatch, abpo, state, where):
    """An S3 endpoint whose name does not resolve (``.invalid`` never does, RFC 2606), and the bucket-region lookup
    pyarrow makes at AWS when neither an endpoint nor a region is set: one line naming the URI, the rule and that it
    was a network failure (StorageUnavailable, retried), never pyarrow's traceback (the region lookup raised from
    pyarrow's FileSystem.from_uri, outside every caller's handling)."""
    from abpo.data import storage
    from abpo.monthly.common import retry_or_fail

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "abpo-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abpo-test-secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    if where == "endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://abpo-no-such-host.invalid:9000")
    elif _aws_resolves():
        pytest.skip("AWS answers from this machine: the bucket-region lookup does not fail here")
    landing = "s3://abpo-no-such-bucket/landing"
    with pytest.raises(storage.StorageUnavailable) as e:
        storage.list_partition(storage.join(landing, "impressions", "month=2026-01"))
    assert retry_or_fail(e.value) == "retry" and "\n" not in str(e.value)
    assert "Could not resolve" in str(e.value)
    rc, out, err = abpo("ingest", "--month", "2026-01", "--set", f"paths.landing={landing}")
    assert rc == 2 and "Traceback" not in err and "abpo-test-secret" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("abpo ingest:")]
    assert len(lines) == 1 and "s3://abpo-no-such-bucket/landing/impressions/month=2026-01" in lines[0], err
    if where == "region lookup":
        assert "resolving the bucket's region failed" in lines[0] and "AWS_REGION" in lines[0], lines[0]
