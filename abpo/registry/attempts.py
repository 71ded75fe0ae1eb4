"""Which process a task attempt is (abpo.registry.tasks): a task's run is tagged with the process that started it,
so that another attempt of the task supersedes it only when that process is gone, and an attempt that was
superseded anyway (by an attempt on another machine, which cannot see its process) records nothing.

The tag is ``<host>:<pid>:<start>``, ``start`` the process's start time in clock ticks since boot (Linux
/proc/<pid>/stat; empty elsewhere), so a pid the kernel gave to a later process does not read as the attempt."""

from __future__ import annotations

import os
import socket

TASK_KEY_TAG = "abpo.task_key"  # the tag naming the task a run does (abpo.registry.tasks)
ATTEMPT_TAG = "abpo.attempt"
SUPERSEDED_TAG = "abpo.superseded"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None (no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


def _start(pid: int) -> str:
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""  # field 22 of proc(5): starttime


def this_process() -> str:
    """The attempt tag of this process."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start(os.getpid())}"


def _parse(tag: str | None) -> tuple[str, int, str] | None:
    host, _, rest = (tag or "").partition(":")
    pid, _, start = rest.partition(":")
    try:
        return host, int(pid), start
    except ValueError:
        return None


def is_this_process(tag: str | None) -> bool:
    return bool(tag) and tag == this_process()


def attempt_alive(tag: str | None) -> bool | None:
    """Whether the process an attempt tag names is alive: True or False on this host, None when it cannot be told
    (another host, or no tag: a run of an abpo from before the tag)."""
    got = _parse(tag)
    if got is None or got[0] != socket.gethostname():
        return None
    _, pid, start = got
    if os.path.isdir("/proc"):
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X"):  # gone, or a zombie that no longer runs anything
            return False
        return not start or len(fields) <= 19 or fields[19] == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe(tag: str | None) -> str:
    got = _parse(tag)
    return f"pid {got[1]} on {got[0]}" if got is not None else "an unknown process"
