"""The Celery e2e test's [core] hostname_callable (AIRFLOW__CORE__HOSTNAME_CALLABLE=worker_hostname.hostname, tests/dags
on PYTHONPATH): each worker on this one machine reports the name in $ABPO_TEST_WORKER_HOSTNAME, as two machines
would report their own hostnames, so task_instance.hostname says which worker ran a task."""

import os


def hostname() -> str:
    return os.environ["ABPO_TEST_WORKER_HOSTNAME"]
