"""The Celery workers' side of the task start-up preload (docs/operations.md, "Task start-up"): Airflow's default
Celery configuration plus ``imports: abpo.monthly.preload``, for ``[celery] celery_config_options =
abpo.monthly.celery_preload.CELERY_CONFIG``.

A Celery worker imports its ``imports`` in its main process when it starts, before its prefork pool forks the pool
processes (Celery's ``WorkController``: the loader's ``init_worker``), and every Airflow task on that worker is forked
from a pool process: so each inherits what abpo.monthly.preload imported, as the LocalExecutor's tasks do through
``[core] mp_forkserver_preload``. Only Airflow processes import this module (it imports Airflow's Celery provider).
Importing the preload never raises (an import that fails is named on the worker's stderr, and the task that needs
it fails with that line), so a broken heavy import cannot stop the worker from starting.
"""

from __future__ import annotations

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

PRELOAD_MODULE = "abpo.monthly.preload"
CELERY_CONFIG = {
    **DEFAULT_CELERY_CONFIG,
    "imports": (*tuple(DEFAULT_CELERY_CONFIG.get("imports") or ()), PRELOAD_MODULE),
}
