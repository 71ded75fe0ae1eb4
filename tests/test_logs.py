"""abpo.logs: the records of a spawned pool's workers are handled by the parent's loggers (abpo.logs.from_workers),
so the experiment's per-cell lines reach the console and a test's caplog like the parent's own."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

from abpo.logs import from_workers


def test_a_spawned_workers_records_reach_this_processs_loggers(caplog):
    spawn = mp.get_context("spawn")
    worker_log = logging.getLogger("abpo.tests.worker")  # a Logger pickles by name: the worker logs to its own
    with caplog.at_level(logging.INFO, logger="abpo"):
        with (from_workers(spawn) as (init, args),
              ProcessPoolExecutor(max_workers=1, mp_context=spawn, initializer=init, initargs=args) as pool):
            pool.submit(worker_log.info, "from a worker: %s", 42).result()
            pool.submit(worker_log.debug, "below the parent's level").result()
    records = [r for r in caplog.records if r.name == "abpo.tests.worker"]
    assert [r.getMessage() for r in records] == ["from a worker: 42"]
    assert records[0].process != os.getpid()
