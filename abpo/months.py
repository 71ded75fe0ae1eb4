"""The one month parser: every month the pipeline takes from a user, a file, a DAG param or a URL is ``YYYY-MM`` with
ASCII digits and nothing after it.

``re.match(r"^\\d{4}-(0[1-9]|1[0-2])$")``, what the code used before, accepts ``"2026-01\\n"`` (``$`` matches before a
trailing newline: a landing partition named ``month=2026-01\\n`` was created) and Arabic-Indic or other Unicode digits
(``\\d`` is any decimal digit in a str pattern). This module is a leaf: it imports nothing of abpo, so the DAG file,
the UI plugin and every module can use it.
"""

from __future__ import annotations

import re

# the pattern without anchors, for composing (the plugin's report names YYYY-MM..YYYY-MM)
MONTH_PATTERN = r"[0-9]{4}-(?:0[1-9]|1[0-2])"
_MONTH = re.compile(MONTH_PATTERN)


class MonthError(ValueError):
    """A month that is not YYYY-MM; the message names where it came from, the value and the rule."""


def is_month(value: object) -> bool:
    """True when ``value`` is a str ``YYYY-MM`` (ASCII digits, month 01..12, nothing before or after)."""
    return isinstance(value, str) and _MONTH.fullmatch(value) is not None


def parse_month(value: object, what: str = "month") -> str:
    """``value`` unchanged when it is a month ``YYYY-MM``; otherwise MonthError naming ``what`` (e.g. ``--month``,
    ``counts.csv line 3: month``), the value as Python writes it (a trailing newline shows as ``\\n``) and the rule."""
    if not is_month(value):
        raise MonthError(f"{what} {value!r}: expected YYYY-MM (rule: ASCII digits 0-9, a month 01-12, nothing before "
                         "or after it)")
    return value  # type: ignore[return-value]


def month_index(month: str) -> int:
    """Months since year 0 (``2026-01`` -> 2026 * 12): consecutive months differ by 1."""
    y, m = parse_month(month).split("-")
    return int(y) * 12 + int(m) - 1


def month_of_index(i: int) -> str:
    return f"{i // 12:04d}-{i % 12 + 1:02d}"


def month_arg(value: str) -> str:
    """argparse ``type=`` for a ``--month`` option: a bad month stops the command before it does anything (argparse
    prints the rule and exits 2)."""
    import argparse

    try:
        return parse_month(value, "--month")
    except MonthError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
