"""The one month parser: every month the pipeline takes from a user, a file, a DAG param or a URL is ``YYYY-MM`` with
ASCII digits and nothing after it.

``re.match(r"^\\d{4}-(0[1-9]|1[0-2])$")``, what the code used before, accepts ``"2026-01\\n"`` (``$`` matches before a
trailing newline: a landing partition named ``month=2026-01\\n`` was created) and Arabic-Indic or other Unicode digits
(``\\d`` is any decimal digit in a str pattern). This module is a leaf: it imports nothing of abpo, so the DAG file,
the UI plugin and every module can use it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

# the pattern without anchors, for composing (the plugin's report names YYYY-MM..YYYY-MM)
# (year 0001-9999: Python's datetime, which bounds every month, has no year 0)
MONTH_PATTERN = r"(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(?:0[1-9]|1[0-2])"
_MONTH = re.compile(MONTH_PATTERN)


class MonthError(ValueError):
    """A month that is not YYYY-MM; the message names where it came from, the value and the rule."""


def is_month(value: object) -> bool:
    """True when ``value`` is a str ``YYYY-MM`` (ASCII digits, year 0001..9999, month 01..12, nothing before or
    after)."""
    return isinstance(value, str) and _MONTH.fullmatch(value) is not None


def parse_month(value: object, what: str = "month") -> str:
    """``value`` unchanged when it is a month ``YYYY-MM``; otherwise MonthError naming ``what`` (e.g. ``--month``,
    ``counts.csv line 3: month``), the value as Python writes it (a trailing newline shows as ``\\n``) and the rule."""
    if not is_month(value):
        raise MonthError(
            f"{what} {value!r}: expected YYYY-MM (rule: ASCII digits 0-9, a year 0001-9999, a month 01-12, nothing "
            "before or after it)"
        )
    return value  # type: ignore[return-value]


class Month(str):
    """A calendar month ``YYYY-MM``, parsed once (:meth:`parse`) and then passed around as a value: its arithmetic
    (:meth:`next`, :meth:`previous`, :meth:`plus`, :meth:`index`, :meth:`minus`) and its bounds live here and nowhere
    else. It is a ``str`` (the text ``YYYY-MM`` itself), so it goes unchanged into SQL parameters, JSON, MLflow tags,
    partition folder names and sorted lists (text order is time order)."""

    __slots__ = ()

    def __new__(cls, value: object, what: str = "month") -> Month:
        if isinstance(value, Month):
            return value
        return super().__new__(cls, parse_month(value, what))

    @classmethod
    def parse(cls, value: object, what: str = "month") -> Month:
        """``value`` as a Month; MonthError naming ``what``, the value and the rule when it is not ``YYYY-MM``."""
        return cls(value, what)

    @classmethod
    def of_index(cls, i: int) -> Month:
        """The month :meth:`index` ``i``."""
        return cls(f"{i // 12:04d}-{i % 12 + 1:02d}")

    @classmethod
    def of_date(cls, when: datetime) -> Month:
        """The month ``when`` falls in (its own calendar; give a UTC datetime for the UTC month)."""
        return cls(f"{when.year:04d}-{when.month:02d}")

    @property
    def year(self) -> int:
        return int(self[:4])

    @property
    def number(self) -> int:
        """1..12."""
        return int(self[5:7])

    def index(self) -> int:  # type: ignore[override]  # str.index(sub) is not meaningful for a month
        """Months since year 0 (``2026-01`` -> 2026 * 12): consecutive months differ by 1."""
        return self.year * 12 + self.number - 1

    def plus(self, n: int) -> Month:
        """The month ``n`` months later (earlier when ``n`` < 0)."""
        return Month.of_index(self.index() + n)

    def next(self) -> Month:
        return self.plus(1)

    def previous(self) -> Month:
        return self.plus(-1)

    def minus(self, other: str) -> int:
        """How many months ``other`` is before this one (``Month("2026-03").minus("2026-01")`` is 2)."""
        return self.index() - Month(other).index()

    def bounds(self) -> tuple[datetime, datetime]:
        """[start, end) of the month in UTC: its first instant and the next month's first instant."""
        nxt = self.next()
        return (datetime(self.year, self.number, 1, tzinfo=UTC), datetime(nxt.year, nxt.number, 1, tzinfo=UTC))

    def __repr__(self) -> str:
        return f"Month({str(self)!r})"

    def __reduce__(self):  # pickles (and copies) as Month(text), not through str's constructor
        return (Month, (str(self),))


def month_range(first: str, n: int) -> list[Month]:
    """``n`` consecutive months from ``first``."""
    start = Month(first)
    return [start.plus(i) for i in range(n)]


def month_index(month: str) -> int:
    """Months since year 0 (``2026-01`` -> 2026 * 12): consecutive months differ by 1."""
    return Month(month).index()


def month_of_index(i: int) -> str:
    return Month.of_index(i)


def month_arg(value: str) -> str:
    """argparse ``type=`` for a ``--month`` option: a bad month stops the command before it does anything (argparse
    prints the rule and exits 2)."""
    import argparse

    try:
        return parse_month(value, "--month")
    except MonthError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
