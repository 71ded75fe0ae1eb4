"""benchmarks/ingest.py on a small month, this checkout only, with the --object-store row: the same landing files
ingested from a directory and from a bucket of a local S3 server (moto) quarantine exactly the injected violations
and give the same batches (the benchmark asserts both; here its output is read back)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_object_store_row_ingests_the_same_month(tmp_path):
    pytest.importorskip("moto.server")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ingest.py"),
            "20000",
            "--baseline",
            "none",
            "--object-store",
            "--memory-limit",
            "512MB",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = re.findall(r"^(now\S*)[^:]*: ([\d,]+) clean, ([\d,]+) quarantined .*; ([\d,]+) batches", out.stdout, re.M)
    assert [r[0] for r in rows] == ["now", "now-s3"], out.stdout
    assert rows[0][1:] == rows[1][1:] and int(rows[0][1].replace(",", "")) > 19_000
    assert len(re.findall(r"end to end +: +[\d.]+s +[\d,]+ rows/s; peak memory [\d,]+ MiB", out.stdout)) == 2
