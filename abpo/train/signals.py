"""Signals held off the MLflow store's writes: a SIGTERM or SIGINT handler that raises (abpo.train.update's
`run_ends_with_the_process`) must not raise inside a write to a SQLite tracking store. An exception raised there
between two bytecodes of SQLAlchemy's session handling leaves the write transaction's connection checked out, the
database locked: ending the run KILLED then fails with "database is locked" after SQLite's busy timeout, and the run
stays RUNNING (2 of the first 9 signals landing in `mlflow.log_metrics` in a loop). While :func:`held` is active, such a
handler is queued (:func:`defer`) and runs as the write returns, in the main thread as Python runs every handler."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

_depth = 0
_pending: list[Callable[[], None]] = []


def holding() -> bool:
    """Whether the main thread is inside :func:`held` (a signal handler should then :func:`defer` its work)."""
    return _depth > 0


def defer(work: Callable[[], None]) -> None:
    """Queue ``work`` (a signal handler's call) to run as the outermost :func:`held` block exits."""
    _pending.append(work)


@contextlib.contextmanager
def held(*, drop: bool = False) -> Iterator[None]:
    """Around an MLflow store write of the main thread: a signal whose handler defers runs as the block exits (its
    exception, UpdateTerminated or KeyboardInterrupt, then raised there, after the write ended cleanly). ``drop``:
    handlers deferred inside are dropped (the run is being ended because of an earlier signal, whose effect follows).
    Outside the main thread nothing is held (no handler runs there)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if drop:
            _pending.clear()
        if _depth == 0:
            while _pending:
                _pending.pop(0)()


class HeldOnEntryAndExit(contextlib.AbstractContextManager):
    """A context manager (the update's MLflow run) whose entry and exit are store writes: both run :func:`held`.
    ``entered`` is called with what the entry returned inside the held block, before a signal held during the entry
    is raised (the update records its run's id there, so that the run it just opened is ended KILLED: the `with`
    statement does not exit a context whose entry raised)."""

    def __init__(self, inner: contextlib.AbstractContextManager, entered: Callable[[object], None] | None = None):
        self.inner = inner
        self.entered = entered

    def __enter__(self):
        with held():
            value = self.inner.__enter__()
            if self.entered is not None:
                self.entered(value)
        return value

    def __exit__(self, *exc):
        with held():
            return self.inner.__exit__(*exc)
