"""Issue 59 point 12: the services the end-to-end tests start (tests/dags/airflow_services.py: the API server, the
scheduler with its LocalExecutor workers and the DAG processor) listen on the loopback only. The API server listened
on 0.0.0.0 (Airflow's default `[api] host`), and the scheduler's log server on every interface, while a test ran.
Every test using the harness checks it once the services are up and again before they stop; this one runs the
services alone."""

from __future__ import annotations

import pytest
from airflow_services import AirflowServices

from tests.listeners import beyond_loopback, listening


@pytest.mark.slow  # migrate a metadata DB, start three Airflow services, parse the DAG: ~1-2 min
def test_the_airflow_services_of_the_tests_listen_on_the_loopback_only(tmp_path):
    with AirflowServices(tmp_path, {}) as af:
        pids = [proc.pid for proc, _ in af.procs.values()]
        ports = {port for _, _, _, port in listening(pids)}
        assert af.port in ports  # the API server's socket is seen: the check looks at the right processes
        wide = beyond_loopback(pids)
        assert wide == [], wide
