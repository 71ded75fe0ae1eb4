"""The console view of abpo's logging: every module logs through ``logging.getLogger(__name__)`` (loggers under
``abpo``); :func:`console` shows their INFO records as plain lines on stdout, which is what the ``abpo`` command,
the Airflow tasks and ``abpo demo`` print. Worker processes hand their records to the parent
(:func:`from_workers`), so a pool's lines go wherever the parent's go. A leaf module: it imports nothing of abpo."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import sys
from collections.abc import Callable, Iterator
from typing import Any

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


def _to_queue(queue: Any, level: int) -> None:
    """A pool worker's initializer: its ``abpo`` records at ``level`` and above go to ``queue``, nowhere else."""
    logger = logging.getLogger(ROOT)
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.addHandler(logging.handlers.QueueHandler(queue))
    logger.setLevel(level)
    logger.propagate = False


class _ToLoggers(logging.handlers.QueueListener):
    """Handles each record a worker sent as if this process had logged it: through the logger of the same name, so
    its handlers, levels and filters apply (the console's prefix, a test's caplog)."""

    def handle(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


@contextlib.contextmanager
def from_workers(mp_context: Any) -> Iterator[tuple[Callable[..., None], tuple[Any, ...]]]:
    """``(initializer, initargs)`` for a process pool of ``mp_context``: its workers' ``abpo`` records are handled by
    this process's loggers while the block runs. A spawned worker starts with no logging set up, so without it their
    lines would be lost (or, printed directly, miss the console's prefix and a test's capture)."""
    queue = mp_context.Queue()
    listener = _ToLoggers(queue)
    listener.start()
    try:
        yield _to_queue, (queue, logging.getLogger(ROOT).getEffectiveLevel())
    finally:
        listener.stop()
