"""One month at a time per state: ``abpo arms month`` (abpo.monthly.month.run_month) holds
``<paths.root>/month.lock`` from before its first step until its last, so a second month started on the same state
is refused in one line naming the holder and the lock file, before it reads or writes anything.

The lock is an exclusive flock(2) on the file, as the replicated loop experiment's (abpo.experiment.loop_lock): the
kernel releases it when its holder exits however it exits (SIGKILL included), so a lock whose holder is gone is
never stale in the kernel; the file names its holder (month, pid, host, since when, the command) for the refusal. A
holder that was killed leaves its record behind: the next month takes the lock over and says whose it was.

The Airflow DAG does not take this lock: its tasks for one month are separate processes (one per step and arm, some
in parallel), Airflow runs one DAG run at a time (max_active_runs=1) and one attempt of a task at a time, and a task
attempt is superseded only when its process is gone (abpo.registry.completed_task_run), which is what keeps a CLI
month and a DAG task apart too."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)

MONTH_LOCK = "month.lock"  # under paths.root
RULE = (
    "one month at a time per state (paths.root); wait for it to end or stop it (its lock is released when it "
    "exits, however it exits)"
)


class MonthLockRefused(ExpectedError, RuntimeError):
    """The state's month lock cannot be taken: nothing was run."""


class MonthBusy(MonthLockRefused):
    """Another month holds the state's month lock (named in the message)."""


def lock_path(cfg: Config) -> Path:
    return cfg.paths.resolve("root") / MONTH_LOCK


def holder_record(month: str, command: str) -> dict[str, Any]:
    """What the lock file says of its holder."""
    return {
        "month": month,
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
    }


def describe(record: dict[str, Any] | None) -> str:
    if not record:
        return "another process (its record not written yet)"
    return (
        f"month {record.get('month')} (pid {record.get('pid')} on {record.get('host')} since {record.get('since')}: "
        f"{record.get('command')})"
    )


def _read_record(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
        if len(data) > 65536:  # a record is a few hundred bytes: anything longer is not one
            return None
    try:
        got = json.loads(data.decode() or "null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return got if isinstance(got, dict) else None


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:  # another user's process of that id exists
        return True
    return True


@contextlib.contextmanager
def month_lock(cfg: Config, month: str, command: str = "") -> Iterator[None]:
    """Hold the state's month lock while the block runs (see the module docstring): MonthBusy naming the holder and
    the lock file when another month holds it; MonthLockRefused naming the file and the rule when it cannot be made."""
    path = lock_path(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # close-on-exec: a process the month starts (the update's torchrun) must not keep the lock after the month
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise MonthLockRefused(
            f"{path}: the month lock cannot be made ({type(e).__name__}: {e.strerror or e}); rule: the state "
            "directory (paths.root) is writable; nothing was run"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MonthBusy(
                f"{path}: held by {describe(_read_record(fd))}; rule: {RULE}; month {month} not started"
            ) from None
        left = _read_record(fd)
        if left:  # its holder was killed before it could clear the file: the kernel released its flock
            here = left.get("host") == os.uname().nodename
            gone = "process gone" if here and not _pid_alive(left.get("pid")) else "its lock released when it ended"
            log.warning(f"{path}: took over the month lock left by {describe(left)} ({gone})")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_record(str(month), command or f"abpo arms month --month {month}")).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: no holder to name
    finally:
        os.close(fd)  # and with it the flock
