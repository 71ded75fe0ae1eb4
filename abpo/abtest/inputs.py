"""Where the report's numbers come from: the DuckDB warehouse (its per-user aggregate user_month_stats,
kept at ingest, so the report never reads the raw log), or a plain CSV of counts from any source."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pyarrow as pa

from abpo.months import is_month, month_index, month_of_index

CSV_REQUIRED = ["month", "arm", "impressions", "clicks"]
CSV_OPTIONAL = ["users"]
COUNTS_SCHEMA = pa.schema(
    [
        pa.field("month", pa.string(), nullable=False),
        pa.field("arm", pa.string(), nullable=False),
        pa.field("impressions", pa.int64(), nullable=False),
        pa.field("clicks", pa.int64(), nullable=False),
        pa.field("users", pa.int64(), nullable=True),
    ]
)
MOMENTS_SQL = "report_user_moments"  # sql/report_user_moments.sql
ASSIGNMENT_SQL = "report_assignment"  # sql/report_assignment.sql


class CSVFormatError(ValueError):
    """A counts CSV breaks the format; the message names the file, the line and what is wrong."""


def parse_months(spec: str) -> list[str]:
    """``2026-02..2026-04`` (inclusive range), ``2026-02,2026-04`` (a list) or ``2026-03`` -> sorted months."""
    spec = spec.strip()
    if ".." in spec:
        start, _, end = spec.partition("..")
        start, end = start.strip(), end.strip()
        for m in (start, end):
            if not is_month(m):
                raise ValueError(f"--months {spec!r}: {m!r} is not YYYY-MM (ASCII digits, month 01-12)")
        a, b = month_index(start), month_index(end)
        if b < a:
            raise ValueError(f"--months {spec!r}: the range ends before it starts")
        return [month_of_index(i) for i in range(a, b + 1)]
    months = [m.strip() for m in spec.split(",") if m.strip()]
    if not months:
        raise ValueError("--months: empty")
    for m in months:
        if not is_month(m):
            raise ValueError(f"--months {spec!r}: {m!r} is not YYYY-MM (ASCII digits, month 01-12)")
    return sorted(set(months))


def counts_from_moments(moments: pa.Table) -> pa.Table:
    """The per-arm-per-month counts (month, arm, impressions, clicks, users) out of the monthly rows of
    sql/report_user_moments.sql: sum Y_u, sum X_u and the number of users n. They equal the warehouse's
    CTR aggregate over the raw rows (sql/ctr_by_arm_month.sql; tests/abtest/test_warehouse_report.py
    checks it), so the report never touches the raw log: both come from the per-user aggregate."""
    rows = [r for r in moments.to_pylist() if r["period"] != "all"]
    return pa.Table.from_pydict(
        {
            "month": [r["period"] for r in rows],
            "arm": [r["arm"] for r in rows],
            "impressions": [r["impressions"] for r in rows],
            "clicks": [r["clicks"] for r in rows],
            "users": [r["users"] for r in rows],
        },
        schema=COUNTS_SCHEMA,
    )


_INT_RE = re.compile(r"[0-9]+")  # ASCII digits only (fullmatch)
INT64_MAX = 2**63 - 1


def read_counts_csv(path: str | Path) -> pa.Table:
    """Read a counts CSV with header ``month,arm,impressions,clicks`` (optionally ``users``; any column
    order). Every value is checked; the first problem raises :class:`CSVFormatError` naming the line:
    unknown/missing/duplicate header columns, a wrong number of fields, a month that is not YYYY-MM,
    an empty arm, a count that is not a non-negative integer, clicks or users above impressions, and a
    second row for the same month and arm. Blank lines are allowed (and said nothing about)."""
    path = Path(path)
    if not path.is_file():
        raise CSVFormatError(f"{path}: no such file")
    expected = ",".join(CSV_REQUIRED) + "[,users]"
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise CSVFormatError(f"{path} line 1: empty file; expected the header {expected}")
            header = [h.strip() for h in header]
            unknown = [h for h in header if h not in CSV_REQUIRED + CSV_OPTIONAL]
            if unknown:
                raise CSVFormatError(f"{path} line 1: unknown column(s) {unknown} in the header; expected {expected}")
            dup = sorted({h for h in header if header.count(h) > 1})
            if dup:
                raise CSVFormatError(f"{path} line 1: column(s) {dup} appear twice in the header")
            missing = [h for h in CSV_REQUIRED if h not in header]
            if missing:
                raise CSVFormatError(f"{path} line 1: header lacks column(s) {missing}; expected {expected}")
            col = {h: i for i, h in enumerate(header)}
            out: dict[str, list] = {f.name: [] for f in COUNTS_SCHEMA}
            seen: dict[tuple[str, str], int] = {}
            for fields in reader:
                line = reader.line_num
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) != len(header):
                    raise CSVFormatError(
                        f"{path} line {line}: expected {len(header)} fields ({','.join(header)}), got {len(fields)}"
                    )
                v = {h: fields[i].strip() for h, i in col.items()}
                if not is_month(v["month"]):
                    raise CSVFormatError(
                        f"{path} line {line}: month {v['month']!r} is not YYYY-MM (ASCII digits, month 01-12)"
                    )
                if not v["arm"]:
                    raise CSVFormatError(f"{path} line {line}: arm is empty")
                nums = {}
                for name in ("impressions", "clicks", "users"):
                    if name not in v:
                        continue
                    if not _INT_RE.fullmatch(v[name]):
                        raise CSVFormatError(f"{path} line {line}: {name} {v[name]!r} is not a non-negative integer")
                    nums[name] = int(v[name])
                    if nums[name] > INT64_MAX:
                        raise CSVFormatError(
                            f"{path} line {line}: {name} {v[name]} is too large; rule: at most "
                            f"{INT64_MAX} (a 64-bit count)"
                        )
                if nums["clicks"] > nums["impressions"]:
                    raise CSVFormatError(
                        f"{path} line {line}: clicks {nums['clicks']} exceed impressions {nums['impressions']}"
                    )
                if "users" in nums and nums["users"] > nums["impressions"]:
                    raise CSVFormatError(
                        f"{path} line {line}: users {nums['users']} exceed impressions "
                        f"{nums['impressions']} (every user has at least one impression)"
                    )
                key = (v["month"], v["arm"])
                if key in seen:
                    raise CSVFormatError(
                        f"{path} line {line}: second row for month {key[0]} and arm {key[1]!r} (first on line {seen[key]})"
                    )
                seen[key] = line
                out["month"].append(v["month"])
                out["arm"].append(v["arm"])
                out["impressions"].append(nums["impressions"])
                out["clicks"].append(nums["clicks"])
                out["users"].append(nums.get("users"))
        except csv.Error as e:
            raise CSVFormatError(f"{path} line {reader.line_num}: not valid CSV ({e})") from e
        except UnicodeDecodeError as e:
            raise CSVFormatError(f"{path} line {reader.line_num + 1}: not UTF-8 text ({e})") from e
    if not out["month"]:
        raise CSVFormatError(f"{path}: header only, no data rows")
    return pa.Table.from_pydict(out, schema=COUNTS_SCHEMA)
