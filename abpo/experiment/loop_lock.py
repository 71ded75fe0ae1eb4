"""One replicated loop experiment per state at a time (abpo.experiment.loop_experiment).

A run holds ``<paths.root>/loop-experiment/run.lock`` from before it plans until it has written its report; each
worker holds its replicate's (or the shared bootstrap's) ``worker.lock`` while it works in that folder, so a worker
of a run that has just died, still stopping, and a worker of the next run never share a replicate. A lock is an
exclusive flock(2) on the file, which the kernel releases when its holder exits however it exits (SIGKILL included:
nothing stale to clear by hand), and the file names its holder (run id, pid, host, since when, what) for the refusal
another process gets."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from abpo.experiment.loop_checks import LoopExperimentRefused

RUN_LOCK = "run.lock"
WORKER_LOCK = "worker.lock"
# how long a worker waits for its folder's worker lock: a worker of a run that just died stops within its grace
WORKER_LOCK_WAIT_S = 90.0


class LoopExperimentBusy(LoopExperimentRefused):
    """The state (or a replicate's folder) is held by another run (or worker), named in the message."""


def holder_record(run: str, what: str) -> dict[str, Any]:
    """What a lock file says of its holder."""
    return {
        "run": run,
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": what,
    }


def describe(record: dict[str, Any] | None) -> str:
    if not record:
        return "another process (its record not written yet)"
    return (
        f"run {record.get('run')} (pid {record.get('pid')} on {record.get('host')} since {record.get('since')}: "
        f"{record.get('command')})"
    )


def _read_record(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        got = json.loads(data.decode() or "null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return got if isinstance(got, dict) else None


@contextlib.contextmanager
def held(path: Path, record: dict[str, Any], *, rule: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the lock file ``path`` (exclusive flock) with ``record`` as its content while the block runs, waiting
    up to ``wait_s`` seconds for another holder; LoopExperimentBusy naming that holder and ``rule`` if it does not
    let go, LoopExperimentRefused if the file cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise LoopExperimentRefused(
            f"{path}: cannot be made ({type(e).__name__}: {e.strerror or e}); rule: the state directory "
            "(paths.root) is writable"
        ) from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LoopExperimentBusy(f"{path}: held by {describe(_read_record(fd))}; rule: {rule}") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: no holder to name
    finally:
        os.close(fd)  # and with it the flock


@contextlib.contextmanager
def run_lock(folder: Path, what: str) -> Iterator[str]:
    """The run's lock on the state's ``folder`` (``<paths.root>/loop-experiment``); yields the run's id, which its
    saved results record."""
    run = uuid.uuid4().hex[:12]
    rule = (
        "one loop experiment per state at a time; wait for it to end or stop it (its lock is released when it "
        "exits, however it exits)"
    )
    with held(folder / RUN_LOCK, holder_record(run, what), rule=rule):
        yield run


@contextlib.contextmanager
def worker_lock(folder: Path, run: str, what: str, wait_s: float = WORKER_LOCK_WAIT_S) -> Iterator[None]:
    """A worker's lock on its replicate's (or the shared bootstrap's) ``folder``."""
    rule = f"one worker in a replicate's folder at a time (waited {wait_s:g} s for a worker of an ended run to stop)"
    with held(folder / WORKER_LOCK, holder_record(run, what), rule=rule, wait_s=wait_s):
        yield
