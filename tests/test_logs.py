"""abpo.logs: the records of a spawned pool's workers are handled by the parent's loggers (abpo.logs.from_workers),
so the experiment's per-cell lines reach the console and a test's caplog like the parent's own; inside an Airflow
task each line reaches the task log once (task_logging); progress bars only on a terminal."""

from __future__ import annotations

import functools
import io
import logging
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from abpo.logs import PROGRESS_BAR_SWITCHES, from_workers, progress_bars_only_on_a_terminal, task_logging


def test_a_spawned_workers_records_reach_this_processs_loggers(caplog):
    spawn = mp.get_context("spawn")
    worker_log = logging.getLogger("abpo.tests.worker")  # a Logger pickles by name: the worker logs to its own
    with caplog.at_level(logging.INFO, logger="abpo"):
        with (
            from_workers(spawn) as (init, args),
            ProcessPoolExecutor(max_workers=1, mp_context=spawn, initializer=init, initargs=args) as pool,
        ):
            pool.submit(worker_log.info, "from a worker: %s", 42).result()
            pool.submit(worker_log.debug, "below the parent's level").result()
    records = [r for r in caplog.records if r.name == "abpo.tests.worker"]
    assert [r.getMessage() for r in records] == ["from a worker: 42"]
    assert records[0].process != os.getpid()


@pytest.fixture
def abpo_logger(monkeypatch):
    """The ``abpo`` logger, its handlers, level and propagation restored after the test; the progress-bar switches
    unset for it."""
    import tqdm.std

    for k in PROGRESS_BAR_SWITCHES:
        monkeypatch.setenv(k, "")  # so that monkeypatch restores (or removes) it after the test
        monkeypatch.delenv(k)
    logger = logging.getLogger("abpo")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    init = tqdm.std.tqdm.__dict__["__init__"]  # tqdm's own, without a disable default an earlier call may have added
    monkeypatch.setattr(
        tqdm.std.tqdm,
        "__init__",
        functools.partialmethod(init.func, *init.args, **{k: v for k, v in init.keywords.items() if k != "disable"}),
    )
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved


def test_in_a_deployed_task_each_line_reaches_the_task_log_once(abpo_logger, caplog, capsys):
    """Without a prefix the records go to the root logger (Airflow's task-log handler) only: nothing on stdout, which
    Airflow copies into the task log too."""
    from abpo.logs import console

    console("")  # e.g. an earlier CLI call in the same process
    task_logging("")
    with caplog.at_level(logging.INFO):
        logging.getLogger("abpo.tests.task").info("ingest 2026-01: 40 rows")
    assert [r.getMessage() for r in caplog.records if r.name == "abpo.tests.task"] == ["ingest 2026-01: 40 rows"]
    assert capsys.readouterr().out == ""
    assert not [h for h in abpo_logger.handlers if getattr(h, "abpo_console", False)]


def test_in_the_demo_each_line_is_on_stdout_marked_and_not_propagated(abpo_logger, caplog, capsys):
    task_logging("abpo| ")
    with caplog.at_level(logging.INFO):
        logging.getLogger("abpo.tests.task").info("gate abpo: passed")
    assert capsys.readouterr().out == "abpo| gate abpo: passed\n"
    assert not [r for r in caplog.records if r.name == "abpo.tests.task"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal(abpo_logger):
    from tqdm import tqdm

    assert progress_bars_only_on_a_terminal(_Tty()) is False
    assert not any(k in os.environ for k in PROGRESS_BAR_SWITCHES)
    out = io.StringIO()
    for _ in tqdm(range(3), file=out, desc="Downloading artifacts"):
        pass
    assert "Downloading artifacts" in out.getvalue()  # drawn while no switch is set

    assert progress_bars_only_on_a_terminal(io.StringIO()) is True  # a pipe / Airflow's task log
    assert {k: os.environ[k] for k in PROGRESS_BAR_SWITCHES} == PROGRESS_BAR_SWITCHES
    out = io.StringIO()
    for _ in tqdm(range(3), file=out, desc="Downloading artifacts"):
        pass
    assert out.getvalue() == ""
    from huggingface_hub.utils import are_progress_bars_disabled
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is False
    assert are_progress_bars_disabled()
