"""The console view of abpo's logging: every module logs through ``logging.getLogger(__name__)`` (loggers under
``abpo``); :func:`console` shows their INFO records as plain lines on stdout, which is what the ``abpo`` command,
the Airflow tasks and ``abpo demo`` print. A leaf module: it imports nothing of abpo."""

from __future__ import annotations

import contextlib
import logging
import sys

ROOT = "abpo"


class _Stdout(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stdout`` is when a record is emitted (a test's capture, Airflow's
    task output), like ``print`` does."""

    abpo_console = True

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ / setStream assign it; the property always wins
        pass


def console(prefix: str = "") -> logging.Handler:
    """Show the ``abpo`` loggers' INFO records on stdout, one plain line each (``prefix`` before every line: the
    demo marks the tasks' lines with it to pick them out of Airflow's output). Idempotent: a second call only
    updates the prefix."""
    logger = logging.getLogger(ROOT)
    handler = next((h for h in logger.handlers if getattr(h, "abpo_console", False)), None)
    if handler is None:
        handler = _Stdout()
        logger.addHandler(handler)
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    handler.setLevel(logging.INFO)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


@contextlib.contextmanager
def quiet(name: str = ROOT):
    """Hide the INFO records of logger ``name`` (and its children) for the block (warnings still show)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)
