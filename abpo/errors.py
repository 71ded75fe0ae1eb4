"""The errors a user causes or meets, as one type: the `abpo` command's error boundary (abpo.cli.main) prints an
:class:`ExpectedError` as one line, ``abpo <command>: <message>``, with exit code 2 (``--debug`` adds the traceback);
any other exception is a bug and keeps its traceback. Library code raises :class:`UsageError` for a bad argument,
option value or path, and a library error type a user can meet (a state that needs another step first) subclasses
:class:`ExpectedError` beside its own base, so the boundary needs no list of them. Imports nothing of abpo: every
layer may raise these."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


class ExpectedError(Exception):
    """An error the user can cause or meet, not a bug: its message says what, where and which rule, on one line, and
    the `abpo` command prints it so (exit code 2). A library error type that is one subclasses it beside its own base
    (``class PreviousMonthIncomplete(ExpectedError, RuntimeError)``)."""


class UsageError(ExpectedError, ValueError):
    """A bad argument, option value or path given to a command: the message names the option, the value and the rule.
    A ValueError, so a caller that catches ValueError around the check still does."""


def count_arg(option: str, what: str, minimum: int = 1) -> Callable[[str], int]:
    """An argparse type for ``option``: a whole number of ``what`` at least ``minimum``, refused when the command
    line is parsed, in argparse's one line (``argument --months: --months 0: rule: a whole number of months >= 1``)."""

    def parse(value: str) -> int:
        try:
            n = int(value.strip())
        except ValueError:
            n = None
        if n is None or n < minimum:
            raise argparse.ArgumentTypeError(f"{option} {value}: rule: a whole number of {what} >= {minimum}")
        return n

    parse.__name__ = what
    return parse


def writable_dir(path: str | Path, option: str = "--out") -> Path:
    """``path`` (the value of ``option``) when abpo can write a directory there: an existing directory it can create
    files in, or a path whose nearest existing ancestor is a directory it can create the rest in. UsageError naming
    the option, the path and the rule otherwise (an existing file, a file in the way, no permission, a read-only
    file system), checked before any work, by creating and removing a probe directory where the output would go."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(
            f"{option} {p}: an existing file, not a directory; rule: a directory abpo can create and write"
        )
    return _probe(p if p.is_dir() else _existing_ancestor(p, option), p, option)


def writable_file(path: str | Path, option: str = "--out") -> Path:
    """``path`` (the value of ``option``) when abpo can write a file there: not a directory, and its directory one
    :func:`writable_dir` accepts. UsageError naming the option, the path and the rule otherwise."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {p}: an existing directory, not a file; rule: a file abpo can create or replace")
    _probe(_existing_ancestor(p, option) if not p.parent.is_dir() else p.parent, p, option)
    return p


def _existing_ancestor(p: Path, option: str) -> Path:
    """The nearest ancestor of ``p`` that exists; UsageError when it is not a directory (a file in the way)."""
    up = p.absolute().parent
    while not up.exists():
        up = up.parent
    if not up.is_dir():
        raise UsageError(f"{option} {p}: {up} is a file, not a directory; rule: a path abpo can create and write")
    return up


def _probe(where: Path, p: Path, option: str) -> Path:
    """``p`` when a directory can be created (and is removed) in ``where``; UsageError with the OS's reason else."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".abpo-write-check-", dir=where))
    except OSError as e:
        raise UsageError(
            f"{option} {p}: cannot write in {where} ({e.strerror or type(e).__name__}); rule: a path abpo can create "
            "and write"
        ) from None
    return p
