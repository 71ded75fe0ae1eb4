"""The ``abpo`` command's subcommands: the commands layer on top of the library (abpo.cli is the entry point; the
import-linter contracts in pyproject.toml keep every other package from importing this one).

    arms.py      ``abpo arms``: bootstrap, one month of the loop (abpo.monthly.month.run_month), status, promote,
                 rollback
    data.py      ``abpo data ...``, ``abpo ingest``, ``abpo restore-month``
    demo.py      ``abpo demo``: the main job end to end through Airflow
    experiment.py ``abpo experiment``: the paper's table, the validation sweep, rounds (abpo.experiment)
    report.py    ``abpo report``: the A/B report
    simulate.py  ``abpo simulate``: one simulated month landed

(``abpo update`` and ``abpo sft`` / ``evaluate`` / ``simulate-log`` are still abpo.train.cli and abpo.policy.cli;
they import only downward.)
"""
