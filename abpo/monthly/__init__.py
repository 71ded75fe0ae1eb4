"""The monthly cycle: one module per step, named like the Airflow task that runs it (dags/abpo_monthly.py), in the
order of :data:`abpo.monthly.steps.STEPS`, which the DAG and ``abpo arms month`` (month.py) both follow.

    bootstrap.py  bootstrap   a failed month m-1 blocks month m; pi_init (SFT, once) -> version 1 of each LLM arm,
                              champion; the ranker arms fitted on the interactions before the first month
    serve.py      serve       each arm's champion serves month m (abpo.sim: simulated traffic, landed as Parquet), or
                              the month must have landed (production)
    ingest.py     ingest      warehouse partition + Great Expectations (abpo.warehouse, abpo.validation)
    update.py     <arm>.update     each LLM arm: its variant from its current champion on its own month-m logs
    register.py   <arm>.register   the update as a version of the arm's model, alias challenger, lineage tags
    gate.py       <arm>.gate       challenger vs champion: offline HR@5 and the off-policy SNIPS CTR
                                   (gate_verdict: a pure function of the numbers)
    gate_users.py                  the gate's held-out users (the dataset's or the warehouse's)
    promote.py    <arm>.promote    champion moves to the challenger only when the gate passed
    refit.py      <arm>.refit      each ranker arm refitted on everything seen through month m, champion
    report.py     report      the A/B report over every month to date; marks the month complete
    month.py      (abpo arms month) the whole month in one process
    common.py     the typed result base (to_json), task keys for idempotent retries, the cached dataset
    steps.py      the ordered list of steps and the one step table, run_step (dependency-free: the DAG imports it)
    airflow_tasks.py     what the DAG's tasks do besides their step: the run's config, fail_fast, the failure hook,
                         the month a run processes, the landing check, the skips, the champion Asset events
    dag_settings.py      the $ABPO_* settings the DAG reads when its file is parsed (dependency-free)
    airflow_isolated.py  the heavy steps' operator in $ABPO_TASK_PYTHON (isolated.py runs there)
    airflow_approval.py  the approval task's operator (approval.py: what it asks and answers)
    pages.py             the UI plugin's pages (plugins/abpo_plugin.py): what each reads, one function per page

``abpo demo`` (abpo.commands.demo) runs the steps through Airflow, as a production scheduler does: its own local
Airflow (local_airflow.py: the environment, airflow.cfg, the months through ``airflow dags test``).

Steps take the config and plain values (a Month, an arm name, version numbers) and return a typed result (a
dataclass with ``to_json()``), so tasks pass registry versions, never local paths. Progress goes through
``logging`` (abpo.logs.console shows it).
"""
