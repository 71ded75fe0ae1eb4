"""The registry's errors (each keeps ``abpo.registry.<name>`` as its module path: the DAG's retry table and
pickling name them so)."""

from __future__ import annotations

from abpo.errors import ExpectedError
from abpo.redact import redact


class Redacted(Exception):
    """An error whose message passes through abpo.redact.redact when it is made: a URI's password or a known secret
    never reaches its message, so neither the CLI's line nor a task log nor a pickled copy holds it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class StateMoved(Redacted, ValueError):
    """The state's SQLite MLflow store names artifact locations under another state directory: the state was copied
    or restored elsewhere, and using it as it is would write into the old directory."""


class NamespaceMismatch(Redacted, ValueError):
    """The state directory belongs to another environment (``paths.namespace``) than the config names: run as it is,
    it would serve, promote and record history in that other environment's registered models."""


class RegistryUnavailable(Redacted, RuntimeError):
    """The MLflow registry could not answer (server down, network, database error): never read as "no alias"."""


class ModelFilesDamaged(Redacted, RuntimeError):
    """A model directory's weights are not whole (a truncated or corrupt ``*.safetensors``, a file that does not
    match the checksum recorded when it was downloaded), or it could not be written (a full disk): the message names
    the file and the rule. An expected error (`abpo` prints one line)."""


class TaskAttemptLive(Redacted, ExpectedError, RuntimeError):
    """Another attempt of the task is still running (its process is alive on this host): it is not superseded and
    nothing is done twice; a retry after it ended finds its completed run."""


class TaskSuperseded(Redacted, ExpectedError, RuntimeError):
    """This attempt's run was superseded while it ran (marked KILLED by another attempt that could not see its
    process, or another attempt completed the task first): its result is not recorded; a retry finds the attempt
    that completed the task."""


class StoreDamaged(RegistryUnavailable, ExpectedError):
    """The SQLite MLflow store is damaged (``PRAGMA quick_check`` fails where the store is opened, or SQLite answers
    "database disk image is malformed" / "file is not a database"): the message names the file and the rule (restore
    it from a backup). A refusal, never retried: every attempt would fail the same way. A RegistryUnavailable, so a
    damaged store is never read as "no champion"."""


class StoreFull(Redacted, ExpectedError, RuntimeError):
    """The disk under the MLflow store or its artifacts is full (SQLite's "database or disk is full", an OSError
    ENOSPC while writing a run's files): the message names the file and the rule (free space). A refusal, never
    retried while the disk stays full; the run it was writing is marked FAILED when the store still takes that."""


for _cls in (
    StateMoved,
    NamespaceMismatch,
    RegistryUnavailable,
    ModelFilesDamaged,
    TaskAttemptLive,
    TaskSuperseded,
    StoreDamaged,
    StoreFull,
):
    _cls.__module__ = "abpo.registry"
