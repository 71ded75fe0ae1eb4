"""Faults that ended in a traceback, by the route a user takes (issue 32, items 10 and 11): each is now one line
naming the file or store and the rule, and what a failed step leaves behind is cleaned up or swept. Where a full disk
is needed, RLIMIT_FSIZE in a subprocess makes writes past the limit fail as on a full disk (EFBIG); where an
unwritable directory is needed (these tests run as root, so permissions do not stop a write), the path goes through
a regular file (ENOTDIR) or is itself a directory where a file must go (EISDIR): real OS errors at the boundary, no
mock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.landed_impressions import DISK_FULL, MONTH, clean_table, land

REPO = Path(__file__).resolve().parents[2]


def test_a_half_truncated_warehouse_is_one_line(abpo, state):
    land(state, clean_table(2000))
    assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    wh = state / "warehouse.duckdb"
    os.truncate(wh, wh.stat().st_size // 2)
    for argv in (["data", "ctr"], ["ingest", "--month", MONTH, "--no-validate"]):
        rc, out, err = abpo(*argv)
        assert rc in (1, 2) and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"reading or writing the warehouse {wh} failed" in err and "restore it from a backup" in err, err


def test_an_unwritable_spill_directory_is_one_line(abpo, state, tmp_path):
    land(state, clean_table())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, out, err = abpo(
        "ingest", "--month", MONTH, "--no-validate", "--set", f"data.warehouse_temp_directory={blocker}/spill"
    )
    assert rc == 2 and "Traceback" not in err, err
    assert f"data.warehouse_temp_directory '{blocker}/spill': cannot create or write the spill directory" in err


def test_gx_data_docs_that_cannot_be_written_are_one_line_and_nothing_is_published(abpo, state):
    land(state, clean_table())
    (state / "validation").mkdir(parents=True)
    (state / "validation" / "data_docs").write_text("a file where the Data Docs directory goes")  # ENOTDIR/EEXIST
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the Great Expectations Data Docs of impressions_2026-01 could not be written" in err, err
    assert "nothing was published" in err
    assert not (state / "validation" / f"impressions_{MONTH}.json").exists()


def test_out_of_memory_in_the_gx_suite_is_one_line(abpo, state, monkeypatch):
    """DuckDB running out of memory while building the suite's batch (monkeypatched at the warehouse's SQL runner:
    the OutOfMemoryException DuckDB raises, wrapped as the runner wraps it) is one line naming the suite and the
    setting to change."""
    import duckdb

    from abpo.warehouse import SQLFileError, Warehouse

    run = Warehouse.run

    def oom(self, name, **params):
        if name == "validate_staged":
            try:
                raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate data of size 256.0 KiB")
            except duckdb.Error as e:
                raise SQLFileError(f"sql/validate_staged.sql: {type(e).__name__}: {e}") from e
        return run(self, name, **params)

    monkeypatch.setattr(Warehouse, "run", oom)
    land(state, clean_table())
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "GX suite impressions_2026-01: out of memory while validating the staged rows" in err
    assert "data.warehouse_memory_limit" in err and "nothing was published" in err


@pytest.mark.slow
def test_the_gx_summary_is_written_only_when_the_month_is_published(abpo, state):
    """A refused ingest (here: the disk fills while the warehouse commits, after the GX audit passed) leaves the
    month's summary as the last published ingest wrote it."""
    land(state, clean_table(50))
    assert abpo("ingest", "--month", MONTH)[0] == 0
    summary = state / "validation" / f"impressions_{MONTH}.json"
    before = summary.read_text()
    assert json.loads(before)["rows"] == 50
    land(state, clean_table(20_000))
    env = {**os.environ, "ABPO_STATE": str(state)}
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(3_000_000), "ingest", "--month", MONTH],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"ingest {MONTH} failed at step the commit of month {MONTH}" in out.stderr, out.stderr[-2000:]
    assert summary.read_text() == before
    assert not [p for p in summary.parent.iterdir() if p.name.endswith(".tmp")]


KILLED_SPILL = """
import os, sys, duckdb
con = duckdb.connect(sys.argv[1], config={"memory_limit": "60MB", "temp_directory": sys.argv[2], "threads": "1",
                                          "preserve_insertion_order": "false"})
con.execute("CREATE TEMP TABLE t AS SELECT range i, md5(range::VARCHAR) s FROM range(1500000)")
con.execute("CREATE TEMP TABLE u AS SELECT * FROM t ORDER BY s")
print(len(os.listdir(sys.argv[2])), flush=True)
os._exit(0)  # killed: no clean-up
"""


@pytest.mark.slow
def test_spill_files_of_a_killed_run_are_swept_on_the_next_open(abpo, state, tmp_path):
    spill = state / "duckdb_tmp"
    spill.mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-c", KILLED_SPILL, str(tmp_path / "other.duckdb"), str(spill)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    left = [p.name for p in spill.iterdir()]
    assert any(n.startswith("duckdb_temp_") and n.endswith(".tmp") for n in left), left
    land(state, clean_table())
    rc, _, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 0, err
    assert [p.name for p in spill.iterdir() if p.name.startswith("duckdb_temp_")] == []


def test_a_read_only_state_store_is_one_line(abpo, state):
    state.mkdir(parents=True)
    (state / "mlflow.db.init.lock").mkdir()  # open(..., "a") fails with EISDIR, as on a read-only state
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "mlflow.db.init.lock: cannot create the MLflow store's init lock" in err and "must be writable" in err


def _safetensors_dir(path: Path, n: int = 50_000) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": np.arange(n, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def test_truncated_weights_given_to_adopt_are_one_line(abpo, state, tmp_path):
    model = _safetensors_dir(tmp_path / "model")
    w = model / "model.safetensors"
    os.truncate(w, w.stat().st_size // 2)
    rc, out, err = abpo("arms", "adopt", "--arm", "abpo", "--model", str(model))
    err = "\n".join(line for line in err.splitlines() if " INFO mlflow." not in line)  # MLflow's own store set-up
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{w}: not a whole safetensors file" in err and "(truncated or damaged)" in err, err


def _register(cfg, tmp_path) -> str:
    from abpo import registry
    from abpo.arms import promotion, versions as arm_versions

    ckpt = _safetensors_dir(tmp_path / "ckpt")
    with registry.start_run(cfg, arm_versions.EXPERIMENT, "update") as run:
        uri = arm_versions.log_arm_model(cfg, "abpo", ckpt)
    return str(promotion.register_champion(cfg, "abpo", uri, run.info.run_id, {"source": "update"}).version)


@pytest.mark.slow
def test_a_truncated_cached_champion_is_downloaded_again(tmp_path, caplog):
    """The gate, the serve and the update take an arm's version through abpo.arms.versions.local_dir: the cached copy
    is verified against the checksums recorded at download before every use, and downloaded again when it fails."""
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.registry import safetensors_problem

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    v = _register(cfg, tmp_path)
    path = arm_versions.local_dir(cfg, "abpo", v)
    w = path / "model.safetensors"
    whole = w.read_bytes()
    os.truncate(w, len(whole) // 2)
    assert "truncated or damaged" in safetensors_problem(w)
    again = arm_versions.local_dir(cfg, "abpo", v)
    assert again == path and w.read_bytes() == whole
    assert "fails its check" in caplog.text and "model.safetensors" in caplog.text
    with open(w, "r+b") as f:  # same size, one byte flipped: the checksum catches it
        f.seek(len(whole) - 1)
        f.write(bytes([whole[-1] ^ 0xFF]))
    assert arm_versions.local_dir(cfg, "abpo", v) == path and w.read_bytes() == whole


LOCAL_DIR = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from abpo.config import load_config
from abpo.arms import versions
from abpo.cli import expected_errors, one_line
cfg = load_config("tiny", ["paths.root=" + sys.argv[1]])
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
try:
    versions.local_dir(cfg, "abpo", sys.argv[3])
except expected_errors() as e:
    print("ONE LINE:", one_line(e), file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.slow
def test_a_full_disk_at_the_download_is_one_line_and_leaves_no_partial_copy(tmp_path):
    """The gate's download of a version (abpo.arms.versions.local_dir) under a full disk (RLIMIT_FSIZE below the
    weights' size): one line naming the file, and no half-written copy left in the cache."""
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    v = _register(cfg, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", LOCAL_DIR, str(tmp_path / "var"), str(100_000), v],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "ONE LINE:" in out.stderr, out.stderr[-3000:]
    assert "downloading abpo-arm-abpo v1 failed" in out.stderr and "must be writable with free space" in out.stderr
    cache = cfg.paths.resolve("models") / "registry" / "abpo-arm-abpo" / f"v{v}"
    assert not cache.exists()


@pytest.mark.slow
def test_a_store_locked_during_a_run_is_one_line_and_the_run_not_left_running(tmp_path):
    """Another writer holds mlflow.db's write lock (a real SQLite EXCLUSIVE transaction from a second connection)
    while a task's run logs (what an update does through abpo.registry.start_run): one line naming the store and the
    rule, and once the lock is free the run is marked FAILED, not left RUNNING."""
    import sqlite3
    import threading

    from mlflow import MlflowClient

    from abpo import registry
    from abpo.cli import one_line
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    registry.configure(cfg)
    holder = sqlite3.connect(str(tmp_path / "var" / "mlflow.db"), timeout=0, check_same_thread=False)
    run_ids = []
    with pytest.raises(registry.RegistryUnavailable) as e:
        with registry.start_run(cfg, "abpo-arms", "update") as run:
            run_ids.append(run.info.run_id)
            holder.execute("BEGIN EXCLUSIVE")
            threading.Timer(
                45.0, holder.rollback
            ).start()  # the other writer finishes after our writes timed out (20 s)
            MlflowClient().log_metric(run.info.run_id, "loss", 1.0)
    msg = one_line(e.value)
    assert "the MLflow store is locked by another writer" in msg and "one writer at a time" in msg, msg
    assert f"run {run_ids[0]} marked FAILED" in msg and "\n" not in str(e.value)
    assert MlflowClient().get_run(run_ids[0]).info.status == "FAILED"
    holder.close()


@pytest.mark.slow
@pytest.mark.parametrize("logged_in", ["update", "arms"])
def test_arms_status_lists_a_logged_model_a_killed_update_never_registered(abpo, state, tmp_path, logged_in):
    """An update logs its model and is killed before registering it (here: its run ends FAILED, as a killed
    attempt's run does once the next attempt marks it): `abpo arms status` lists the orphan, not the registered
    one; in the updates' experiment (abpo-update, where the monthly update logs its model) as in abpo-arms (a
    bootstrap's or a refit's). Before, only abpo-arms was searched and a killed update's model was never listed."""
    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config

    cfg = load_config("tiny")  # paths.root = $ABPO_STATE (the state fixture)
    v = _register(cfg, tmp_path)
    orphan = {}
    experiment = cfg.update.mlflow_experiment if logged_in == "update" else arm_versions.EXPERIMENT
    with pytest.raises(KeyboardInterrupt):
        with registry.start_run(cfg, experiment, "update") as run:
            orphan["uri"] = arm_versions.log_arm_model(cfg, "abpo", _safetensors_dir(tmp_path / "ckpt2"))
            orphan["run"] = run.info.run_id
            raise KeyboardInterrupt  # killed between logging and registering
    rc, out, err = abpo("arms", "status")
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("orphaned logged model")]
    assert len(lines) == 1 and orphan["uri"].removeprefix("models:/") in lines[0], out
    assert f"run {orphan['run']} " in lines[0] and "never registered" in lines[0]
    assert f'"version": "{v}"' in out  # the registered champion is shown as before, not as an orphan
