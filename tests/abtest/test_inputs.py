"""Reading counts: the months spec and the CSV path (a malformed file gives an error naming the line)."""

from __future__ import annotations

import pytest

from abpo.abtest.inputs import CSVFormatError, parse_months, read_counts_csv


@pytest.mark.parametrize(
    "spec,months",
    [
        ("2026-02..2026-04", ["2026-02", "2026-03", "2026-04"]),
        ("2025-11..2026-02", ["2025-11", "2025-12", "2026-01", "2026-02"]),
        ("2026-03", ["2026-03"]),
        ("2026-04, 2026-02", ["2026-02", "2026-04"]),
    ],
)
def test_parse_months(spec, months):
    assert parse_months(spec) == months


@pytest.mark.parametrize(
    "spec,msg",
    [("2026-04..2026-02", "ends before it starts"), ("2026-13", "not YYYY-MM"), ("26-01..2026-02", "not YYYY-MM")],
)
def test_parse_months_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_months(spec)


def write(tmp_path, text, name="counts.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_good_csv_any_column_order_optional_users(tmp_path):
    t = read_counts_csv(write(tmp_path, "arm,month,clicks,impressions\nabpo,2026-02,5,100\n\ngrpo,2026-02,4,90\n"))
    assert t.column("arm").to_pylist() == ["abpo", "grpo"]
    assert t.column("impressions").to_pylist() == [100, 90]
    assert t.column("users").to_pylist() == [None, None]
    t = read_counts_csv(write(tmp_path, "\ufeffmonth,arm,impressions,clicks,users\n2026-02,abpo,100,5,20\n"))
    assert t.column("users").to_pylist() == [20]


BAD = [
    ("", "line 1: empty file"),
    ("month,arm,impressions\n", "line 1: header lacks column(s) ['clicks']"),
    ("month,arm,impressions,clicks,ctr\n", "line 1: unknown column(s) ['ctr']"),
    ("month,arm,impressions,clicks,clicks\n", "line 1: column(s) ['clicks'] appear twice"),
    ("month,arm,impressions,clicks\n", "header only, no data rows"),
    ("month,arm,impressions,clicks\n2026-02,abpo,100,5\n2026-02,grpo,100\n", "line 3: expected 4 fields"),
    (
        "month,arm,impressions,clicks\n2026-02,abpo,100,5\n2026-03,grpo,1e3,5\n",
        "line 3: impressions '1e3' is not a non-negative integer",
    ),
    ("month,arm,impressions,clicks\n2026-02,abpo,100,-5\n", "line 2: clicks '-5' is not a non-negative integer"),
    (
        "month,arm,impressions,clicks\n2026-02,abpo,100,5\n\n2026-02,grpo,100,500\n",
        "line 4: clicks 500 exceed impressions 100",
    ),
    ("month,arm,impressions,clicks\nFeb 2026,abpo,100,5\n", "line 2: month 'Feb 2026' is not YYYY-MM"),
    ("month,arm,impressions,clicks\n2026-02, ,100,5\n", "line 2: arm is empty"),
    (
        "month,arm,impressions,clicks\n2026-02,abpo,100,5\n2026-03,abpo,100,5\n2026-02,abpo,90,4\n",
        "line 4: second row for month 2026-02 and arm 'abpo' (first on line 2)",
    ),
    ("month,arm,impressions,clicks,users\n2026-02,abpo,100,5,101\n", "line 2: users 101 exceed impressions 100"),
    ("month,arm,impressions,clicks,users\n2026-02,abpo,100,5,\n", "line 2: users '' is not a non-negative integer"),
    (
        'month,arm,impressions,clicks\n2026-02,"abpo,100,5\n',
        "line 2: expected 4 fields (month,arm,impressions,clicks), got 2",
    ),
]


@pytest.mark.parametrize("text,msg", BAD)
def test_malformed_csv_names_file_and_line(tmp_path, text, msg):
    p = write(tmp_path, text)
    with pytest.raises(CSVFormatError) as e:
        read_counts_csv(p)
    assert any(alt in str(e.value) for alt in msg.split(" || ")), str(e.value)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(CSVFormatError, match="no such file"):
        read_counts_csv(tmp_path / "nope.csv")


def test_not_utf8(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes("month,arm,impressions,clicks\n2026-02,caf\xe9,1,0\n".encode("latin-1"))
    with pytest.raises(CSVFormatError, match="not UTF-8"):
        read_counts_csv(p)
