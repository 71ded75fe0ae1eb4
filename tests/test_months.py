"""abpo.months.Month: the one month value type (parse, next, previous, index, bounds)."""

import json
import pickle
from datetime import UTC, datetime

import pytest

from abpo.months import Month, MonthError, month_index, month_of_index, month_range


def test_parse_is_strict_and_names_where():
    assert Month.parse("2026-01") == "2026-01"
    for bad in ("2026-1", "2026-13", "2026-00", "2026-01\n", " 2026-01", "２０２６-01", "2026-01-01", 202601, None):
        with pytest.raises(MonthError, match="--month"):
            Month.parse(bad, "--month")


@pytest.mark.parametrize(
    ("m", "nxt", "prev"),
    [("2026-01", "2026-02", "2025-12"), ("2026-12", "2027-01", "2026-11"), ("0001-02", "0001-03", "0001-01")],
)
def test_next_previous_across_years(m, nxt, prev):
    assert Month(m).next() == nxt and Month(m).previous() == prev
    assert Month(m).next().previous() == m
    assert isinstance(Month(m).next(), Month)


def test_there_is_no_month_before_year_1():
    """Year 0 is not a year (datetime, which bounds every month, has none): 0000-MM is not a month (issue 48)."""
    with pytest.raises(MonthError, match="a year 0001-9999"):
        Month("0001-01").previous()


def test_index_plus_minus_and_range():
    assert Month("2026-01").index() == 2026 * 12 == month_index("2026-01")
    assert Month.of_index(2026 * 12 + 11) == "2026-12" == month_of_index(2026 * 12 + 11)
    assert Month("2026-03").minus("2025-12") == 3 and Month("2025-12").minus("2026-03") == -3
    assert Month("2026-11").plus(14) == "2028-01" and Month("2026-01").plus(-13) == "2024-12"
    assert month_range("2026-11", 3) == ["2026-11", "2026-12", "2027-01"]
    assert month_range("2026-11", 0) == []


def test_bounds_are_utc_half_open():
    assert Month("2026-02").bounds() == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
    assert Month("2026-12").bounds()[1] == datetime(2027, 1, 1, tzinfo=UTC)
    assert Month.of_date(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == "2026-12"


def test_a_month_is_its_text_everywhere():
    m = Month("2026-05")
    assert json.dumps({"month": m}) == '{"month": "2026-05"}'
    assert f"month={m}" == "month=2026-05" and hash(m) == hash("2026-05")
    assert pickle.loads(pickle.dumps(m)) == m and isinstance(pickle.loads(pickle.dumps(m)), Month)
    assert sorted([Month("2026-02"), "2025-12", Month("2026-01")]) == ["2025-12", "2026-01", "2026-02"]
    assert Month(m) is m and repr(m) == "Month('2026-05')"
