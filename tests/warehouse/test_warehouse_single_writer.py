"""One writer at a time on the warehouse file, across processes (two Celery workers on two machines are two
processes; docs/deployment-celery.md "Shared storage"): DuckDB's file lock makes a second writer, or a reader while a
writer holds the file, fail at once with WarehouseBusy naming the file (the DAG retries it with backoff:
abpo.monthly.common.TRANSIENT), never write beside the first. Two processes ingesting the same month at the same
time leave the month ingested once, whichever order they got the lock in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.warehouse import Warehouse

ARMS = ["abpo", "grpo", "ml_retrain", "popularity"]
MONTH = "2025-02"
ROWS = 300

# One writer process, as the ingest task on a worker: opens the warehouse for writing (when given "hold": says so and
# waits for a line on stdin), ingests the month, prints its clean rows; "read" only opens it read-only, as the
# update, gate and report steps do. WarehouseBusy is printed and exits 3.
WRITER = textwrap.dedent("""
    import sys
    from abpo.warehouse import Warehouse, WarehouseBusy
    path, landing, month, hold = sys.argv[1:5]
    try:
        with Warehouse(path, read_only=hold == "read") as wh:
            if hold == "hold":
                print("opened", flush=True)
                sys.stdin.readline()
            if hold != "read":
                print("clean", wh.ingest_month(landing, month, ["abpo", "grpo", "ml_retrain", "popularity"]).rows_clean,
                      flush=True)
    except WarehouseBusy as e:
        print("busy", e, flush=True)
        sys.exit(3)
""")


def _writer(path, landing, hold: str = "") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(landing), MONTH, hold or "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _month(path) -> tuple[int, int, int]:
    """(clean rows of the month, distinct impression ids, successful ingest runs of the month)."""
    with Warehouse(path, read_only=True) as wh:
        rows, distinct = wh.con.execute(
            "SELECT count(*), count(DISTINCT impression_id) FROM impressions WHERE month = ?", [MONTH]
        ).fetchone()
        runs = wh.con.execute("SELECT count(*) FROM ingest_runs WHERE month = ?", [MONTH]).fetchone()[0]
    return rows, distinct, runs


def _landed(tmp_path):
    landing = tmp_path / "landing"
    write_impressions(synthetic_impressions(ROWS, MONTH, seed=0, n_users=30, n_items=200)[0], landing, MONTH)
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    return path, landing


def test_a_second_writer_and_a_reader_are_refused_while_one_writes_then_the_second_ingest_replaces(tmp_path):
    path, landing = _landed(tmp_path)
    first = _writer(path, landing, "hold")
    try:
        assert first.stdout.readline().strip() == "opened"  # the first writer holds the file
        second = subprocess.run(
            [sys.executable, "-c", WRITER, str(path), str(landing), MONTH, "-"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 3, (second.stdout, second.stderr[-2000:])
        assert second.stdout.startswith(
            f"busy {path}: the warehouse is in use by another process (DuckDB allows "
            "one writer); retry when it has finished"
        ), second.stdout
        reader = subprocess.run(
            [sys.executable, "-c", WRITER, str(path), str(landing), MONTH, "read"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert reader.returncode == 3 and "in use by another process" in reader.stdout, reader.stdout
        out, err = first.communicate("go\n", timeout=300)
        assert first.returncode == 0 and out.strip() == f"clean {ROWS}", (out, err[-2000:])
    finally:
        first.kill()
        first.wait()
    assert _month(path) == (ROWS, ROWS, 1)  # the refused writer wrote nothing
    again = subprocess.run(
        [sys.executable, "-c", WRITER, str(path), str(landing), MONTH, "-"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and again.stdout.strip() == f"clean {ROWS}", (again.stdout, again.stderr[-2000:])
    assert _month(path) == (ROWS, ROWS, 2)  # the retry replaced the month: ingested once, not twice


def test_two_writers_at_once_leave_the_month_ingested_once(tmp_path):
    path, landing = _landed(tmp_path)
    procs = [_writer(path, landing) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    # each either ingested or was refused as busy (whichever got the lock second, if they overlapped)
    assert codes in ([0, 0], [0, 3]), [(c, out, err[-1500:]) for c, out, err in results]
    for code, out, _ in results:
        assert out.strip() == f"clean {ROWS}" if code == 0 else "in use by another process" in out
    assert _month(path) == (ROWS, ROWS, codes.count(0))
