"""The ``abpo`` command's subcommands: the commands layer on top of the library (abpo.cli is the entry point; the
import-linter contracts in pyproject.toml keep every other package from importing this one).

    airflow_install.py ``abpo airflow install``: the DAG and the UI plugin into an Airflow deployment's folders
    arms.py      ``abpo arms ACTION``: bootstrap, one month of the loop (abpo.monthly.month.run_month), size-update,
                 status (one subcommand per action)
    arms_champions.py ``abpo arms promote | rollback | pin | unpin | history | adopt``: the champion by hand and its
                 record (registered beside the others by arms.py)
    data.py      ``abpo data ...``: prepare, synth, ctr, rebuild-aggregates
    ingest.py    ``abpo ingest``, ``abpo restore-month`` (registered after ``abpo data`` by data.py)
    demo.py      ``abpo demo``: the main job end to end through Airflow
    experiment.py ``abpo experiment``: the paper's table, the validation sweep, rounds (abpo.experiment)
    policy.py    ``abpo sft``, ``abpo evaluate``, ``abpo simulate-log``: pi_init, its offline metrics, a synthetic
                 D_bandit (abpo.policy)
    report.py    ``abpo report``: the A/B report
    simulate.py  ``abpo simulate``: one simulated month landed
    update.py    ``abpo update``: one ABPO (or ablation / GRPO) update from the warehouse's log (abpo.train)

"""
