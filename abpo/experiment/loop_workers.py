"""The replicated loop experiment's worker processes (abpo.experiment.loop_experiment): what a job is, the config it
runs under, the shared bootstrap and one replicate's months as a worker runs them, and the pool that runs them.

A worker dies with the run that started it (:func:`die_with_parent`): a worker that outlived its run kept promoting
and wrote a result for a run that was gone. It holds its folder's worker lock while it works there
(abpo.experiment.loop_lock), and returns its result to the run, which alone records it (result.json, done.json)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment.loop_fingerprints import save_json
from abpo.experiment.loop_lock import worker_lock

if TYPE_CHECKING:
    from abpo.config import Config

# the paths a replicate (and the shared bootstrap) keeps under its own state root, whatever the config says
STATE_PATHS = {
    "landing": "landing",
    "warehouse": "warehouse.duckdb",
    "models": "models",
    "reports": "reports",
    "mlflow_artifacts": "mlartifacts",
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal a process gets when its parent dies (Linux)
PARENT_POLL_S = 1.0  # how often a worker's watchdog looks for its parent
STOP_GRACE_S = 30.0  # after its SIGTERM, how long a worker whose parent died has before the watchdog SIGKILLs it


@dataclasses.dataclass(frozen=True)
class Job:
    """What a worker process needs: the config as the user named it, the state it works in, and what to do."""

    config_ref: str
    overrides: tuple[str, ...]
    state: str  # its paths.root
    threads: int  # policy.num_threads
    replicate: int = -1  # -1: the shared bootstrap
    months: tuple[str, ...] = ()
    bootstrap_state: str = ""  # a replicate's source state
    fingerprint: str = ""
    code: str = ""  # code_digest() of the run that made the job
    run: str = ""  # the id of the run that made the job (abpo.experiment.loop_lock.run_lock)


def job_config(job: Job) -> Config:
    """The job's config: the user's, with the state, its own SQLite MLflow store and paths under it, the thread
    count and (a replicate) sim.replicate."""
    from abpo.config import load_config

    state = Path(job.state)
    sets = [
        *job.overrides,
        f"paths.root={state}",
        f"paths.mlflow_tracking_uri=sqlite:///{state / 'mlflow.db'}",
        *(f"paths.{k}={v}" for k, v in STATE_PATHS.items()),
        f"policy.num_threads={job.threads}",
    ]
    if job.replicate >= 0:
        sets.append(f"sim.replicate={job.replicate}")
    return load_config(job.config_ref, sets)


def _worker_output(log_path: Path) -> None:
    """A worker's stdout, stderr and abpo's log lines go to ``log_path`` (the console shows one line per
    replicate)."""
    import logging
    import sys

    from abpo.logs import ROOT, progress_bars_only_on_a_terminal

    log_path.parent.mkdir(parents=True, exist_ok=True)
    fh = log_path.open("a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fh.fileno(), 1)
    os.dup2(fh.fileno(), 2)
    progress_bars_only_on_a_terminal(fh)
    root = logging.getLogger(ROOT)
    for old in [h for h in root.handlers if getattr(h, "abpo_loop_experiment", False)]:
        root.removeHandler(old)  # a worker process runs several jobs: each logs to its own file only
        old.close()
    handler = logging.StreamHandler(fh)
    handler.abpo_loop_experiment = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def run_bootstrap(job: Job) -> dict[str, Any]:
    """The shared bootstrap (a worker): every arm's first champion in ``job.state``; returns what the run records
    as ``done.json`` beside it."""
    state = Path(job.state)
    _worker_output(state.parent / "bootstrap.log")
    from abpo.monthly.bootstrap import bootstrap_arms

    with worker_lock(state.parent, job.run, "the shared bootstrap"):
        t = time.time()
        cfg = job_config(job)
        arms = bootstrap_arms(cfg).arms
        return {
            "fingerprint": job.fingerprint,
            "code": job.code,
            "arms": arms,
            "seconds": round(time.time() - t, 1),
            "state": str(state),
        }


def _prepare_replicate_state(cfg: Config, job: Job) -> None:
    """A copy of the shared bootstrap's state at ``job.state``, its MLflow store relocated there; a copy that was
    interrupted before it was ready (no ``.ready``) is made again."""
    from abpo.registry import relocate_state

    state, ready = Path(job.state), Path(job.state) / ".ready"
    if ready.exists():
        return
    shutil.rmtree(state, ignore_errors=True)
    tmp = state.with_name(state.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(job.bootstrap_state, tmp)
    tmp.replace(state)
    relocate_state(cfg, job.bootstrap_state)
    ready.write_text(job.bootstrap_state)


def month_summary(res: Any, seconds: float) -> dict[str, Any]:
    """What a replicate keeps of one month's run (abpo.monthly.month.MonthResult): time, traffic per arm, and per
    LLM arm whether the update ran, the gate passed and the champion moved."""
    arms: dict[str, dict[str, Any]] = {}
    for arm, done in res.arms.items():
        a: dict[str, Any] = {}
        if "skipped" in done:
            a["skipped"] = done["skipped"]
        if "gate" in done:
            a["gate_passed"] = bool(done["gate"].passed)
        if "promote" in done:
            a["promoted"] = bool(done["promote"].promoted)
            a["champion"] = done["promote"].champion_version
        if a:
            arms[arm] = a
    per_arm = res.serve.per_arm if res.serve is not None else {}
    return {
        "month": res.month,
        "seconds": round(seconds, 1),
        "served": {k: {f: v.get(f) for f in ("impressions", "clicks", "users")} for k, v in per_arm.items()},
        "arms": arms,
    }


def run_replicate(job: Job) -> dict[str, Any]:
    """Replicate ``job.replicate`` (a worker): its state from the shared bootstrap, each month through
    abpo.monthly.month.run_month (a month completed before is not run again), then its per-user moments with the
    months' summaries, returned to the run, which records them as ``result.json``."""
    state = Path(job.state)
    _worker_output(state.parent / "run.log")
    from abpo.abtest.report import load_from_warehouse
    from abpo.monthly.month import run_month
    from abpo.monthly.report import month_completed
    from abpo.sim.simulator import series_salt

    with worker_lock(state.parent, job.run, f"replicate {job.replicate}"):
        t0 = time.time()
        cfg = job_config(job)
        _prepare_replicate_state(cfg, job)
        months: list[dict[str, Any]] = []
        previous = state.parent / "months.json"
        earlier = {m["month"]: m for m in json.loads(previous.read_text())} if previous.exists() else {}
        for m in job.months:
            if month_completed(cfg, m) and m in earlier:
                months.append({**earlier[m], "reused": True})
                continue
            t = time.time()
            res = run_month(cfg, m, simulate=True)
            months.append({**month_summary(res, time.time() - t), "run": job.run})
            save_json(previous, months)
        _, moments = load_from_warehouse(cfg.paths.resolve("warehouse"), list(job.months))
        return {
            "fingerprint": job.fingerprint,
            "code": job.code,
            "replicate": job.replicate,
            "salt": series_salt(cfg),
            "months": months,
            "moments": moments.to_pylist(),
            "seconds": round(time.time() - t0, 1),
            "threads": job.threads,
            "state": str(state),
        }


def die_with_parent(parent: int) -> None:
    """The pool's worker initializer: the worker ends when the run (process ``parent``) ends, however it ends. On
    Linux the kernel sends it SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG); everywhere a watchdog thread
    looks for the parent every :data:`PARENT_POLL_S` s and, once it is gone, sends the worker SIGTERM, then SIGKILL
    after :data:`STOP_GRACE_S` s (an update in flight ends its MLflow run on SIGTERM, abpo.train.signals)."""
    import signal
    import sys
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:  # also catches a parent that died before prctl above
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="abpo-parent-watchdog", daemon=True).start()


@contextlib.contextmanager
def worker_pool(n_workers: int, threads: int) -> Iterator[Any]:
    """The replicates' process pool: spawned workers (a fresh interpreter each) that die with this process
    (die_with_parent), their BLAS / OpenMP pools limited (thread_environment), importing this process's abpo
    (abpo_first_on_path). An error in the block waits for the running jobs, as before; an interrupt
    (KeyboardInterrupt, SystemExit) stops the workers at once."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    spawn = mp.get_context("spawn")
    with thread_environment(threads), abpo_first_on_path():
        pool = ProcessPoolExecutor(
            max_workers=n_workers, mp_context=spawn, initializer=die_with_parent, initargs=(os.getpid(),)
        )
        try:
            yield pool
        except Exception:
            pool.shutdown(wait=True)
            raise
        except BaseException:
            _stop_workers(pool)
            raise
        pool.shutdown(wait=True)


def _stop_workers(pool: Any) -> None:
    """SIGTERM to the pool's worker processes, and the pool shut down without waiting (nothing public lists a
    ProcessPoolExecutor's processes: its ``_processes``)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def abpo_first_on_path() -> Iterator[None]:
    """While the block runs, no sys.path entry holds another copy of the ``abpo`` package than the one this process
    runs. A spawned worker starts with its parent's sys.path, and loading a registered model in this process (an
    MLflow pyfunc: its ``code_paths`` copy of abpo goes first on sys.path, abpo.registry.models) would make the
    worker import that copy, which has no configs (seen in the test suite: a config "not found" under an
    mlartifacts/.../code directory)."""
    import sys

    import abpo

    real = Path(abpo.__file__).resolve().parents[1]
    saved = list(sys.path)
    sys.path[:] = [
        p
        for p in sys.path
        if not (Path(p or ".") / "abpo" / "__init__.py").exists() or Path(p or ".").resolve() == real
    ]
    try:
        yield
    finally:
        sys.path[:] = saved


@contextlib.contextmanager
def thread_environment(threads: int) -> Iterator[None]:
    """While the block runs, the environment a spawned worker starts with limits its BLAS / OpenMP pools (implicit's
    ALS, numpy) to ``threads``, as policy.num_threads limits torch: the workers share the cores out."""
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update({k: str(threads) for k in THREAD_VARIABLES})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
