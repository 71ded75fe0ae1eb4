"""The monthly tasks' imports, done once ahead of the fork: the module Airflow's ``[core] mp_forkserver_preload`` names
(with ``[scheduler] mp_start_method = forkserver``; docs/operations.md, "Task start-up").

Airflow's LocalExecutor forks every task from a worker process, and a task then imports what its step needs: torch,
transformers, PEFT, MLflow, DuckDB, pyarrow, Great Expectations and abpo's own modules, about 15-20 s of CPU per task
on the 2-core machine, for each of a month's 20 tasks. Importing this module in the forkserver process (single
threaded: the safe place to fork from) makes every worker, and so every task forked from it, inherit them
copy-on-write. Importing it does nothing else: no MLflow call, no state read, no thread started.
"""

from __future__ import annotations

import importlib
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


def preload() -> list[str]:
    """Import :data:`HEAVY` and every abpo module outside :data:`SKIP`; returns the names imported. A module whose
    import fails (an optional extra not installed, such as deepspeed behind abpo.train's ZeRO path) is left to the
    task that needs it, which then fails with the real error."""
    import abpo

    done = []
    names = [*HEAVY, *(m.name for m in pkgutil.walk_packages(abpo.__path__, "abpo."))]
    for name in names:
        if any(name == s or name.startswith(s + ".") for s in SKIP):
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        done.append(name)
    return done


PRELOADED = preload()
