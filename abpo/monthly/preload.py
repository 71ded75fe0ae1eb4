"""The monthly tasks' imports, done once ahead of the fork: the module Airflow's ``[core] mp_forkserver_preload`` names
(with ``[scheduler] mp_start_method = forkserver``; docs/operations.md, "Task start-up").

Airflow's LocalExecutor forks every task from a worker process, and a task then imports what its step needs: torch,
transformers, PEFT, MLflow, DuckDB, pyarrow, Great Expectations and abpo's own modules, about 15-20 s of CPU per task
on the 2-core machine, for each of a month's 20 tasks. Importing this module in the forkserver process (single
threaded: the safe place to fork from) makes every worker, and so every task forked from it, inherit them
copy-on-write. Importing it does nothing else: no MLflow call, no state read, no thread started.

Importing it never raises (the forkserver would die, and every later process start fail with EOFError): an
import that raises anything but ImportError is said on stderr in one line, naming the module and the error, and a
task that imports that module fails with the same line (:data:`FAILED`, :class:`FailedImports`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import pkgutil

# the third-party packages the steps import inside their functions (warmed here, called only through their doors:
# abpo.registry for MLflow, abpo.validation for Great Expectations)
# (MLflow's SQL stores, with SQLAlchemy and Alembic, load at a process's first store call: 1 s of a task that only reads
# an alias)
HEAVY = (
    "torch",
    "transformers",
    "peft",
    "duckdb",
    "pyarrow",
    "pyarrow.parquet",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "great_expectations",
)
# abpo's packages no monthly task runs: the commands, the experiment runner, this module and the Celery workers'
# configuration (it imports Airflow's Celery provider)
SKIP = ("abpo.cli", "abpo.commands", "abpo.experiment", "abpo.monthly.preload", "abpo.monthly.celery_preload")


# module -> the one line its import raised in this process, for an import that raised anything but ImportError (a
# CUDA library that cannot load raises RuntimeError inside `import torch`): :func:`preload` records it, says it on
# stderr, and :class:`FailedImports` makes every later import of that module in this process, and in every process
# forked from it (each task), raise ImportError with that line
FAILED: dict[str, str] = {}


class FailedImports(importlib.abc.MetaPathFinder):
    """The first finder on ``sys.meta_path`` once an import of the preload failed: importing a module of
    :data:`FAILED` (or a submodule of one, whose parent is imported first) raises ImportError with its line. Without
    it a task would import the half-initialised package again (torch then fails on something else) or, with the
    forkserver dead, never start at all (EOFError)."""

    def find_spec(self, name, path=None, target=None):
        why = FAILED.get(name)
        if why is not None:
            raise ImportError(why, name=name)
        return None


def _failed(name: str, e: BaseException) -> None:
    """Record that importing ``name`` raised ``e`` (not an ImportError), say it on stderr in one line, and block the
    module's later imports (:class:`FailedImports`)."""
    import sys

    text = " ".join(str(e).split())[:500]
    FAILED[name] = (
        f"import {name} failed in the task start-up preload (abpo.monthly.preload): {type(e).__name__}: {text}; "
        f"rule: a task that needs {name} cannot run until its import works; fix the environment and restart the "
        "scheduler (whose forkserver imported it) or the Celery worker"
    )
    if not any(isinstance(f, FailedImports) for f in sys.meta_path):
        sys.meta_path.insert(0, FailedImports())
    sys.stderr.write(FAILED[name] + "\n")
    sys.stderr.flush()


def _import(name: str) -> bool:
    """Import ``name``; False when it cannot be imported. An ImportError (an optional extra not installed, such as
    deepspeed behind abpo.train's ZeRO path) is left to the task that needs it, which then meets the real error; any
    other exception is recorded (:func:`_failed`): importing never raises here, so the forkserver survives."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the whole point: nothing an import raises kills the forkserver
        _failed(name, e)
        return False
    return True


def preload() -> list[str]:
    """Import :data:`HEAVY` and every abpo module outside :data:`SKIP`; returns the names imported. Never raises: a
    module whose import fails is left out (:func:`_import`; one that raised anything but ImportError is recorded in
    :data:`FAILED` and said on stderr, and the task that imports it fails with that line)."""
    done = [name for name in HEAVY if _import(name)]
    if not _import("abpo"):
        return done
    import abpo

    def walk_error(name: str) -> None:  # a package that raised while the walk imported it (not an ImportError)
        import sys

        e = sys.exc_info()[1]
        if e is not None and not isinstance(e, ImportError) and name not in FAILED:
            _failed(name, e)

    names = [m.name for m in pkgutil.walk_packages(abpo.__path__, "abpo.", onerror=walk_error)]
    for name in names:
        if any(name == s or name.startswith(s + ".") for s in SKIP) or name in FAILED:
            continue
        if _import(name):
            done.append(name)
    return done


PRELOADED = preload()
