"""abpo.data.storage against a real S3 API (moto's server on 127.0.0.1, IAM enforced; fixture ``s3`` in
tests/conftest.py): a landing zone, the dataset files and the warehouse's ingest read from a bucket, with the
credentials and the endpoint from the environment only; the refusals (a missing bucket, denied access, a partition
without its _SUCCESS marker, a truncated object) are one line each and publish nothing; local paths as before."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.landed_impressions import synthetic_table


def _objects(s3, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", []))


def test_uri_helpers_and_local_paths_are_not_uris():
    from abpo.data import storage

    assert storage.is_uri("s3://b/landing") and storage.is_uri("gs://b/x") and storage.is_uri("memory://x")
    assert not storage.is_uri("/var/landing") and not storage.is_uri("landing") and not storage.is_uri("file:///x")
    assert storage.join("s3://b/landing/", "impressions", "month=2026-01") == "s3://b/landing/impressions/month=2026-01"
    assert storage.join("s3://b/l?endpoint_override=h:1", "x") == "s3://b/l/x?endpoint_override=h:1"
    assert storage.basename("s3://b/l/part-a.parquet?scheme=http") == "part-a.parquet"
    assert storage.bucket("s3://my-bucket/landing/x") == "my-bucket"


def test_config_keeps_a_uri_and_refuses_it_where_a_local_path_is_needed(make_cfg, tmp_path):
    cfg = make_cfg("paths.landing=s3://my-bucket/landing", "paths.mlflow_artifacts=s3://my-bucket/mlartifacts")
    assert cfg.paths.location("landing") == "s3://my-bucket/landing"  # not <root>/s3:/my-bucket/landing
    assert cfg.paths.location("mlflow_artifacts") == "s3://my-bucket/mlartifacts"
    with pytest.raises(
        ValueError,
        match=r"paths.landing = 's3://my-bucket/landing': an object-store URI where a "
        r"local path is needed",
    ):
        cfg.paths.resolve("landing")
    bad = make_cfg("paths.warehouse=s3://my-bucket/warehouse.duckdb")
    with pytest.raises(
        ValueError,
        match=r"paths.warehouse = .*rule: a local path \(only paths.landing and "
        r"paths.mlflow_artifacts may be object-store URIs",
    ):
        bad.paths.resolve("warehouse")
    local = make_cfg()
    assert local.paths.location("landing") == local.paths.resolve("landing") == tmp_path / "landing"
    assert not list(tmp_path.rglob("s3:*"))


def test_a_month_landed_in_a_bucket_ingests_as_the_same_month_landed_locally(s3, tmp_path):
    from abpo.data.schemas import write_impressions, write_interactions
    from abpo.warehouse import Warehouse

    landing = f"s3://{s3.bucket}/landing"
    table = synthetic_table()
    uri = write_impressions(table, landing, "2026-01", part="a")
    assert uri == f"{landing}/impressions/month=2026-01/part-a.parquet"
    inter = pa.table(
        {
            "user_id": pa.array([1, 1, 2], pa.int64()),
            "item_id": pa.array([5, 6, 7], pa.int64()),
            "event_time": pa.array([1, 2, 3], pa.timestamp("us", tz="UTC")),
            "rating": pa.array([4.0, 3.0, 5.0], pa.float32()),
            "position": pa.array([0, 1, 0], pa.int32()),
        }
    )
    write_interactions(inter, landing, "2026-01", part="a")
    assert _objects(s3) == [
        "landing/impressions/month=2026-01/_SUCCESS",
        "landing/impressions/month=2026-01/part-a.parquet",
        "landing/interactions/month=2026-01/_SUCCESS",
        "landing/interactions/month=2026-01/part-a.parquet",
    ]
    write_impressions(table, tmp_path / "landing", "2026-01", part="a")
    arms = sorted(set(table.column("arm").to_pylist()))
    with Warehouse(tmp_path / "remote.duckdb") as wr, Warehouse(tmp_path / "local.duckdb") as wl:
        r = wr.ingest_month(landing, "2026-01", arms)
        lo = wl.ingest_month(tmp_path / "landing", "2026-01", arms)
        assert r.files == lo.files == ["part-a.parquet"] and r.rows_clean == lo.rows_clean == table.num_rows
        cols = "impression_id, user_id, arm, clicked, source_file, source_row"
        q = f"SELECT {cols} FROM impressions ORDER BY impression_id"
        assert wr.con.sql(q).fetchall() == wl.con.sql(q).fetchall()
        assert wr.ingest_interactions(landing, "2026-01") == 3
        assert wr.con.sql("SELECT DISTINCT source_file FROM interactions").fetchall() == [
            (f"{landing}/interactions/month=2026-01/part-a.parquet",)
        ]
    assert not list(tmp_path.rglob("abpo-landing-*"))  # the local copies are gone


@pytest.mark.parametrize("case", ["missing bucket", "denied", "no marker", "truncated object"])
def test_refusals_are_one_line_and_publish_nothing(s3, tmp_path, case):
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import IngestError, Warehouse

    landing = f"s3://{s3.bucket}/landing"
    table = synthetic_table()
    arms = sorted(set(table.column("arm").to_pylist()))
    write_impressions(table, landing, "2026-01", part="a")
    with Warehouse(tmp_path / "w.duckdb") as wh:
        before = wh.ingest_month(landing, "2026-01", arms).rows_clean  # the month as published
        runs = wh.con.sql("SELECT count(*) FROM ingest_runs").fetchall()
        key = "landing/impressions/month=2026-01/part-a.parquet"
        if case == "missing bucket":
            landing = f"s3://{s3.bucket}-gone/landing"
            expected = (
                rf"s3://{s3.bucket}-gone/landing/impressions/month=2026-01: bucket '{s3.bucket}-gone' does not exist"
            )
        elif case == "denied":
            s3.as_user("nobody")
            expected = r"month=2026-01: access denied \(ACCESS_DENIED while listing\); rule: credentials come from"
        elif case == "no marker":
            write_impressions(synthetic_table(seed=2), landing, "2026-01", part="b")  # a second upload, still running
            s3.client.delete_object(Bucket=s3.bucket, Key="landing/impressions/month=2026-01/_SUCCESS")
            expected = r"month=2026-01: 2 object\(s\) but no _SUCCESS marker; rule: an object-store partition is read"
        else:
            body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body[: len(body) // 2])  # the upload cut short
            expected = rf"{key}: not a whole Parquet object \(.*\); a truncated or partial upload is never ingested"
        with pytest.raises(IngestError, match=expected) as e:
            wh.ingest_month(landing, "2026-01", arms)
        assert "\n" not in str(e.value)
        assert wh.con.sql("SELECT count(*) FROM impressions WHERE month = '2026-01'").fetchall() == [(before,)]
        assert wh.con.sql("SELECT count(*) FROM ingest_runs").fetchall() == runs


def test_the_landing_sensor_reads_a_bucket(s3, make_cfg):
    from abpo.data.schemas import write_impressions
    from abpo.monthly.common import landing_status

    cfg = make_cfg(f"paths.landing=s3://{s3.bucket}/landing")
    assert landing_status(cfg, "2026-01", "_SUCCESS") == (
        False,
        f"s3://{s3.bucket}/landing/impressions/month=2026-01: no landing partition yet",
    )
    write_impressions(synthetic_table(), cfg.paths.location("landing"), "2026-01", part="a")
    ok, found = landing_status(cfg, "2026-01", "_SUCCESS")
    assert ok and found.endswith("1 object(s) and the _SUCCESS marker")


def test_the_dataset_files_read_from_a_bucket_load_as_the_local_ones(s3, movielens_dir):
    from abpo.data.loaders import load_movielens

    d = movielens_dir(30, 12)
    for name in ("movies.csv", "ratings.csv"):
        s3.client.upload_file(str(d / name), s3.bucket, f"datasets/ml/{name}")
    remote, local = load_movielens(f"s3://{s3.bucket}/datasets/ml"), load_movielens(d)
    assert remote.catalog.equals(local.catalog) and remote.interactions.equals(local.interactions)
    assert remote.sequences == local.sequences and remote.name == "movielens:ml"
    from abpo.data.loaders import DataFormatError

    with pytest.raises(DataFormatError, match=rf"s3://{s3.bucket}/datasets/none/movies.csv: file not found"):
        load_movielens(f"s3://{s3.bucket}/datasets/none")


def test_mlflow_artifacts_go_to_the_bucket(s3, make_cfg):
    import mlflow

    from abpo import registry

    cfg = make_cfg(f"paths.mlflow_artifacts=s3://{s3.bucket}/mlartifacts")
    with registry.start_run(cfg, "abpo-storage-test", "one"):
        mlflow.log_text("hello", "notes/hello.txt")
        run_id = mlflow.active_run().info.run_id
    keys = _objects(s3, "mlartifacts/")
    assert any(k.endswith(f"{run_id}/artifacts/notes/hello.txt") for k in keys), keys
    assert not (cfg.paths.resolve("root") / "s3:").exists()


def test_local_parquet_landing_is_unchanged(tmp_path):
    from abpo.data.schemas import write_impressions

    path = write_impressions(synthetic_table(), tmp_path / "landing", "2026-01", part="a")
    assert path == tmp_path / "landing" / "impressions" / "month=2026-01" / "part-a.parquet"
    assert sorted(p.name for p in path.parent.iterdir()) == ["part-a.parquet"]  # no marker written locally
    assert pq.read_table(path).num_rows == 60


@pytest.mark.parametrize("user", ["abpo", "nobody"])
def test_credentials_from_an_airflow_connection(s3, monkeypatch, user, tmp_path):
    """$ABPO_STORAGE_CONNECTION names an Airflow Connection (here defined as AIRFLOW_CONN_ABPO_S3, as a secrets
    backend would give it): its login, password and extra endpoint_url are what pyarrow uses; with no AWS variable
    of the environment's own. The Connection of a user without a policy is refused."""
    import json

    from abpo.data import storage
    from abpo.data.schemas import write_impressions

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(var, "unset")  # recorded, so that what apply_connection exports is undone after the test
        monkeypatch.delenv(var)
    key, secret = s3.keys[user]
    monkeypatch.setenv(
        "AIRFLOW_CONN_ABPO_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": key,
                "password": secret,
                "extra": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
            }
        ),
    )
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv(storage.CONNECTION_ENV, "abpo_s3")
    monkeypatch.setattr(storage, "_applied", set())
    landing = f"s3://{s3.bucket}/landing"
    if user == "abpo":
        write_impressions(synthetic_table(), landing, "2026-01", part="a")
        assert storage.listdir(f"{landing}/impressions/month=2026-01") == [
            f"{landing}/impressions/month=2026-01/_SUCCESS",
            f"{landing}/impressions/month=2026-01/part-a.parquet",
        ]
    else:
        with pytest.raises(storage.StorageError, match=r"access denied \(ACCESS_DENIED while writing\)"):
            write_impressions(synthetic_table(), landing, "2026-01", part="a")
    monkeypatch.setenv(storage.CONNECTION_ENV, "no_such_connection")
    with pytest.raises(
        storage.StorageError,
        match=r"ABPO_STORAGE_CONNECTION='no_such_connection': the Airflow "
        r"Connection cannot be read",
    ):
        storage.listdir(landing)
