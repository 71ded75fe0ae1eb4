"""`abpo loop-experiment`: the monthly loop run S times from one shared bootstrap, compared arm against arm with a
two-stage interval (replicates, then users within a replicate; abpo.abtest.replicated, docs/report.md "The
replicated loop experiment").

    shared bootstrap (once per bootstrap fingerprint; a worker process): pi_init's SFT, every arm's first champion,
    the ranker fits and pi_init's gate scores, in a state of its own (abpo.monthly.bootstrap.bootstrap_arms)
    -> replicate r = 0..S-1 (worker processes, up to the machine's cores at once): a copy of that state,
       relocated (abpo.commands.state.relocate), with sim.replicate = r (its own traffic draws and users' arm
       assignment, abpo.sim.simulator.series_salt), runs the months with the month driver of `abpo arms month
       --simulate` (abpo.monthly.month.run_month: serve, ingest, update, register, gate, promote, refit, hold,
       report), then saves its per-user moments per arm and month (sql/report_user_moments.sql) as its result
    -> one report (markdown + JSON) over the replicates' results.

A replicate's result is keyed by its fingerprint, the config (less paths and thread counts) with its
``sim.replicate`` and the months, and records the code that made it (:func:`code_digest`: abpo's modules less the
commands and the A/B analysis, and sql/). A rerun with a larger S, or the same S, reuses every replicate whose
fingerprint has a result made by this code (``--any-code``: by any code, named in the report); a replicate
interrupted mid-way resumes at its first unfinished month (months are idempotent); one that other code began starts
over. The shared bootstrap likewise (its fingerprint: the settings it reads).

Layout under ``<paths.root>/loop-experiment/``: ``bootstrap/<fingerprint>/`` (the shared state, ``done.json``),
``replicates/<fingerprint>/`` (a replicate's state, ``run.log``, ``result.json``), ``reports/<label>/``
(``report.md``, ``report.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abpo.abtest.replicated import ReplicatedReport
    from abpo.config import Config

DIR = "loop-experiment"
# the paths a replicate (and the shared bootstrap) keeps under its own state root, whatever the config says
STATE_PATHS = {
    "landing": "landing",
    "warehouse": "warehouse.duckdb",
    "models": "models",
    "reports": "reports",
    "mlflow_artifacts": "mlartifacts",
}
# keys that change how fast, not what (left out of every fingerprint)
SPEED_KEYS = {("policy", "num_threads")}
# what the shared bootstrap does not read: the months' traffic, updates, report and the experiment table
BOOTSTRAP_IGNORES = {
    "sim": ("salt", "replicate", "requests_per_user"),
    "arms": ("update_max_examples", "update_logs", "replay_months"),
}
BOOTSTRAP_SECTIONS_IGNORED = ("update", "report")
# what report.json keeps of each replicate's result
REPORTED_REPLICATE_KEYS = ("replicate", "fingerprint", "code", "salt", "seconds", "threads", "months")


# ------------------------------------------------------------------------------------------------ fingerprints


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_digest() -> str:
    """sha256 over the sources that run a month: every abpo module except abpo/commands (the CLI) and abpo/abtest
    (the report's analysis, rerun from the saved moments), and sql/*.sql. Any change there starts new replicates."""
    from abpo.paths import PACKAGE_DIR, SQL_DIR

    h = hashlib.sha256()
    files = sorted(
        p for p in PACKAGE_DIR.rglob("*.py") if p.relative_to(PACKAGE_DIR).parts[0] not in ("commands", "abtest")
    )
    files += sorted(SQL_DIR.glob("*.sql"))
    for p in files:
        h.update(str(p.relative_to(p.parents[1] if p.suffix == ".sql" else PACKAGE_DIR.parent)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _settings(cfg: Config) -> dict[str, Any]:
    """The config as a dict, less its name, paths and :data:`SPEED_KEYS`."""
    d = dataclasses.asdict(cfg)
    d.pop("name", None)
    d.pop("paths", None)
    for section, key in SPEED_KEYS:
        d[section].pop(key, None)
    return d


def bootstrap_fingerprint(cfg: Config) -> str:
    """What the shared bootstrap depends on besides the code: the settings less :data:`BOOTSTRAP_IGNORES` and the
    sections it never reads (:data:`BOOTSTRAP_SECTIONS_IGNORED`; of ``experiment`` only validation_fraction,
    pi_init's early stopping)."""
    d = _settings(cfg)
    for section in BOOTSTRAP_SECTIONS_IGNORED:
        d.pop(section, None)
    d["experiment"] = {"validation_fraction": d["experiment"]["validation_fraction"]}
    for section, keys in BOOTSTRAP_IGNORES.items():
        for k in keys:
            d[section].pop(k, None)
    return _digest({"bootstrap": d})


def replicate_fingerprint(cfg: Config, months: list[str]) -> str:
    """What replicate ``cfg.sim.replicate``'s result depends on besides the code: every setting (less paths and
    speed) and the months."""
    return _digest({"replicate": _settings(cfg), "months": months})


# ------------------------------------------------------------------------------------------------ the work


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


def _save_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def run_bootstrap(job: Job) -> dict[str, Any]:
    """The shared bootstrap (a worker): every arm's first champion in ``job.state``; ``done.json`` beside it."""
    state = Path(job.state)
    done = state.parent / "done.json"
    _worker_output(state.parent / "bootstrap.log")
    from abpo.monthly.bootstrap import bootstrap_arms

    t = time.time()
    cfg = job_config(job)
    arms = bootstrap_arms(cfg).arms
    out = {
        "fingerprint": job.fingerprint,
        "code": job.code,
        "arms": arms,
        "seconds": round(time.time() - t, 1),
        "state": str(state),
    }
    _save_json(done, out)
    return out


def _prepare_replicate_state(cfg: Config, job: Job) -> None:
    """A copy of the shared bootstrap's state at ``job.state``, its MLflow store relocated there; a copy that was
    interrupted before it was ready (no ``.ready``) is made again."""
    from abpo.commands.state import relocate

    state, ready = Path(job.state), Path(job.state) / ".ready"
    if ready.exists():
        return
    shutil.rmtree(state, ignore_errors=True)
    tmp = state.with_name(state.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(job.bootstrap_state, tmp)
    tmp.replace(state)
    relocate(cfg, job.bootstrap_state)
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
    abpo.monthly.month.run_month (a month completed before is not run again), then its per-user moments saved
    with the months' summaries as ``result.json``."""
    state = Path(job.state)
    _worker_output(state.parent / "run.log")
    from abpo.abtest.report import load_from_warehouse
    from abpo.monthly.month import run_month
    from abpo.monthly.report import month_completed
    from abpo.sim.simulator import series_salt

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
        months.append(month_summary(res, time.time() - t))
        _save_json(previous, months)
    _, moments = load_from_warehouse(cfg.paths.resolve("warehouse"), list(job.months))
    out = {
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
    _save_json(state.parent / "result.json", out)
    return out


def load_result(path: Path, fingerprint: str, code: str | None) -> dict[str, Any] | None:
    """A finished replicate's (or bootstrap's) saved result with this fingerprint, made by ``code`` (None: by any
    code), else None."""
    if not path.exists():
        return None
    try:
        got = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if got.get("fingerprint") != fingerprint or (code is not None and got.get("code") != code):
        return None
    return got


def start_over_unless(folder: Path, code: str) -> None:
    """A replicate's (or the bootstrap's) folder that another code began is removed, so its work starts over; one
    this code began (an interrupted run) is kept, and resumes. The code is recorded in ``code.txt``."""
    mark = folder / "code.txt"
    if folder.exists() and (not mark.exists() or mark.read_text().strip() != code):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark.write_text(code)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def worker_pool(n_workers: int, threads: int) -> Iterator[Any]:
    """The replicates' process pool: spawned workers (a fresh interpreter each), their BLAS / OpenMP pools limited
    (thread_environment), importing this process's abpo (abpo_first_on_path)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    spawn = mp.get_context("spawn")
    with (
        thread_environment(threads),
        abpo_first_on_path(),
        ProcessPoolExecutor(max_workers=n_workers, mp_context=spawn) as pool,
    ):
        yield pool


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


# ------------------------------------------------------------------------------------------------ the experiment


@dataclasses.dataclass
class LoopExperiment:
    """What `abpo loop-experiment` did and wrote."""

    months: list[str]
    replicates: list[dict[str, Any]]  # each replicate's result, replicate order
    reused: list[int]  # the replicates found finished
    bootstrap: dict[str, Any]
    bootstrap_reused: bool
    workers: int
    seconds: float
    markdown: Path
    json: Path
    summary: list[str]  # the headline lines


def headline_pairs(cfg: Config, arms: list[str]) -> list[tuple[str, str]]:
    """Each updated LLM arm minus the holdback, then the candidate minus the other updated LLM arms."""
    from abpo.arms.names import LLM, entry

    hold = cfg.report.holdback_arm if cfg.report.holdback_arm in arms else ""
    llm = [a for a in arms if entry(a).kind == LLM]
    out = [(a, hold) for a in llm] if hold else []
    cand = cfg.report.candidate_arm
    out += [(cand, a) for a in llm if a != cand and cand in llm]
    return out or [(arms[0], arms[1])]


def run_loop_experiment(
    cfg: Config,
    *,
    config_ref: str,
    overrides: list[str],
    replicates: int,
    months: int,
    workers: int = 0,
    out_dir: str | Path | None = None,
    prune: bool = False,
    any_code: bool = False,
    target_mde_pp: float = 0.5,
    echo=print,
) -> LoopExperiment:
    """The experiment (module docstring): ``replicates`` S >= 1 replicates of ``months`` months from
    ``sim.start_month``, ``workers`` processes at once (0: min(cores, replicates to run))."""
    from abpo.months import month_range

    _check_request(cfg, replicates, months)
    t0 = time.time()
    month_list = [str(m) for m in month_range(cfg.sim.start_month, months)]
    root = cfg.paths.resolve("root") / DIR
    code = code_digest()
    sets = tuple(o for o in overrides if not o.split("=", 1)[0].strip().startswith("paths."))
    b_fp = bootstrap_fingerprint(cfg)
    b_dir = root / "bootstrap" / b_fp
    results, rep_jobs = _plan_replicates(cfg, config_ref, sets, replicates, month_list, root, b_dir, code, any_code)
    reused = sorted(results)
    n_workers = max(1, min(workers or cores(), max(len(rep_jobs), 1)))
    threads = max(1, cores() // n_workers)  # torch threads per replicate: the cores shared out
    rep_jobs = [dataclasses.replace(j, threads=threads) for j in rep_jobs]
    echo(
        f"abpo loop-experiment: {replicates} replicate(s) x {months} month(s) ({month_list[0]}..{month_list[-1]}), "
        f"{len(reused)} finished before, {len(rep_jobs)} to run on {n_workers} worker(s) x {threads} thread(s); "
        f"under {root}"
    )
    bootstrap = load_result(b_dir / "done.json", b_fp, None if any_code else code)
    if bootstrap is None and rep_jobs:
        start_over_unless(b_dir, code)
    bootstrap_reused = bootstrap is not None
    if rep_jobs:
        with worker_pool(n_workers, threads) as pool:
            if bootstrap is None:
                bootstrap = _shared_bootstrap(pool, cfg, config_ref, sets, b_dir, b_fp, code, echo)
            _run_replicates(pool, rep_jobs, results, replicates, prune=prune, t0=t0, echo=echo)
    elif bootstrap is None:
        bootstrap = {"note": "every replicate was finished before; its shared bootstrap is not on this machine"}
    ordered = [results[r] for r in range(replicates)]
    report, headline = _analyse(cfg, ordered, month_list)
    label = f"{month_list[0]}..{month_list[-1]}-S{replicates}-{_digest(_settings(cfg))[:8]}"
    out = Path(out_dir) if out_dir else root / "reports" / label
    out.mkdir(parents=True, exist_ok=True)
    wall = time.time() - t0
    md = _report_markdown(
        cfg, report, headline, ordered, code, replicates=replicates, months=months, wall=wall, workers=n_workers,
        ran=len(rep_jobs), reused=len(reused), bootstrap=bootstrap, bootstrap_reused=bootstrap_reused,
    )  # fmt: skip
    (out / "report.md").write_text(md)
    payload = {
        "config": config_ref,
        "overrides": list(overrides),
        "months": month_list,
        "replicates": [{k: r.get(k) for k in REPORTED_REPLICATE_KEYS} for r in ordered],
        "reused": reused,
        "bootstrap": {**(bootstrap or {}), "reused": bootstrap_reused, "fingerprint": b_fp},
        "code": code,
        "workers": n_workers,
        "cores": cores(),
        "seconds": round(wall, 1),
        "analysis": report.to_json(),
    }
    _save_json(out / "report.json", payload)
    sizing: list[str] = []
    if target_mde_pp > 0:
        sizing = _add_sizing(cfg, ordered, month_list, headline, target_mde_pp, n_workers, bootstrap, md, payload, out)
    return LoopExperiment(
        month_list, ordered, reused, bootstrap or {}, bootstrap_reused, n_workers, wall, out / "report.md",
        out / "report.json", _headline_lines(report, headline) + sizing,
    )  # fmt: skip


def _check_request(cfg: Config, replicates: int, months: int) -> None:
    """Refuse what cannot be run: fewer than one replicate or month, or a config that sets ``sim.replicate`` (the
    experiment numbers its replicates 0..S-1 itself)."""
    if replicates < 1:
        raise ValueError(f"--replicates {replicates}: rule: >= 1")
    if months < 1:
        raise ValueError(f"--months {months}: rule: >= 1")
    if cfg.sim.replicate != 0:
        raise ValueError(
            f"config sim.replicate = {cfg.sim.replicate}: rule: 0 (the experiment numbers its replicates 0..S-1 itself)"
        )


def _plan_replicates(
    cfg: Config,
    config_ref: str,
    sets: tuple[str, ...],
    replicates: int,
    month_list: list[str],
    root: Path,
    b_dir: Path,
    code: str,
    any_code: bool,
) -> tuple[dict[int, dict[str, Any]], list[Job]]:
    """(the results of the replicates 0..S-1 found finished, by replicate: made by this ``code``, or by any with
    ``any_code``; a job for each of the others, one thread each until the cores are shared out). A replicate's
    folder that other code began is started over (start_over_unless)."""
    results: dict[int, dict[str, Any]] = {}
    jobs: list[Job] = []
    for r in range(replicates):
        rcfg = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, replicate=r))
        fp = replicate_fingerprint(rcfg, month_list)
        found = load_result(root / "replicates" / fp / "result.json", fp, None if any_code else code)
        if found is not None:
            results[r] = found
        else:
            start_over_unless(root / "replicates" / fp, code)
            jobs.append(
                Job(config_ref, sets, str(root / "replicates" / fp / "state"), 1, r, tuple(month_list),
                    str(b_dir / "state"), fp, code)
            )  # fmt: skip
    return results, jobs


def _shared_bootstrap(
    pool: Any, cfg: Config, config_ref: str, sets: tuple[str, ...], b_dir: Path, b_fp: str, code: str, echo
) -> dict[str, Any]:
    """The shared bootstrap (run_bootstrap) in a worker of ``pool``, from an empty ``<b_dir>/state`` (an interrupted
    one starts over) with the config's torch threads (0: every core); returns its result (``done.json``)."""
    base_threads = max(1, int(cfg.policy.num_threads) or cores())
    echo(f"[bootstrap] pi_init and every arm's first champion, once: log {b_dir / 'bootstrap.log'}")
    job = Job(config_ref, sets, str(b_dir / "state"), base_threads, fingerprint=b_fp, code=code)
    shutil.rmtree(b_dir / "state", ignore_errors=True)  # an interrupted bootstrap starts over
    bootstrap = pool.submit(run_bootstrap, job).result()
    echo(f"[bootstrap] done in {bootstrap['seconds']:.0f}s")
    return bootstrap


def _run_replicates(
    pool: Any,
    jobs: list[Job],
    results: dict[int, dict[str, Any]],
    replicates: int,
    *,
    prune: bool,
    t0: float,
    echo,
) -> None:
    """Run the replicates' ``jobs`` (run_replicate) in the workers of ``pool``, adding each result to ``results`` as
    it finishes (its state deleted with ``prune``). A failed replicate cancels those not started and stops the run,
    naming its log; the finished ones are kept."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = {pool.submit(run_replicate, j): j for j in jobs}
    while pending:
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for fut in finished:
            j = pending.pop(fut)
            try:
                res = fut.result()
            except Exception as e:
                for waiting in pending:
                    waiting.cancel()
                raise RuntimeError(
                    f"replicate {j.replicate} failed ({type(e).__name__}: {e}); its log: "
                    f"{Path(j.state).parent / 'run.log'}; the finished replicates are kept"
                ) from e
            results[j.replicate] = res
            secs = ", ".join(f"{m['seconds']:.0f}" for m in res["months"])
            echo(
                f"[replicate {j.replicate}] done in {res['seconds']:.0f}s (months {secs} s; "
                f"{len(results)}/{replicates} finished, {time.time() - t0:.0f}s elapsed)"
            )
            if prune:
                shutil.rmtree(j.state, ignore_errors=True)


def _analyse(
    cfg: Config, ordered: list[dict[str, Any]], month_list: list[str]
) -> tuple[ReplicatedReport, list[tuple[str, str]]]:
    """(the two-stage analysis of the replicates' per-user moments, every arm pair per month and over the period
    (abpo.abtest.replicated.analyse_replicates); the headline pairs (headline_pairs))."""
    from abpo.abtest import replicated as rp
    from abpo.monthly.common import arms_of

    arms = arms_of(cfg)
    per_rep = [rp.moments_by_period(r["moments"]) for r in ordered]
    hold = cfg.report.holdback_arm if cfg.report.holdback_arm in arms else ""
    report = rp.analyse_replicates(
        per_rep,
        month_list,
        arms,
        rp.arm_pairs(arms, holdback=hold, candidate=cfg.report.candidate_arm),
        confidence=cfg.report.confidence,
        power=cfg.report.power,
    )
    return report, headline_pairs(cfg, arms)


def _report_markdown(
    cfg: Config,
    report: ReplicatedReport,
    headline: list[tuple[str, str]],
    ordered: list[dict[str, Any]],
    code: str,
    *,
    replicates: int,
    months: int,
    wall: float,
    workers: int,
    ran: int,
    reused: int,
    bootstrap: dict[str, Any] | None,
    bootstrap_reused: bool,
) -> str:
    """report.md: the analysis's tables (abpo.abtest.replicated.replicated_markdown) with what the run cost above
    the headline comparisons: wall time, replicates run and reused, the shared bootstrap's and each replicate's
    seconds, and a note naming the other code that made replicates reused with --any-code (said, never hidden)."""
    from abpo.abtest import replicated as rp

    title = f"Replicated loop experiment: {cfg.name}, {replicates} replicate(s) x {months} month(s)"
    md = rp.replicated_markdown(report, headline, title=title)
    boot = "reused" if bootstrap_reused else f"{float((bootstrap or {}).get('seconds', 0)):.0f} s"
    rep_secs = ", ".join(f"{float(r['seconds']):.0f}" for r in ordered)
    other = sorted({str(r.get("code")) for r in ordered if r.get("code") != code})
    if other:
        rep_secs += (
            f" (NOTE: {sum(r.get('code') != code for r in ordered)} replicate(s) were made by other code, digest(s) "
            f"{', '.join(other)}; this code is {code})"
        )
    cost = (
        f"Wall time {wall / 60:.1f} min on {cores()} core(s) ({workers} worker(s)); "
        f"{ran} replicate(s) run now, {reused} reused; shared bootstrap {boot}; replicate wall "
        f"times {rep_secs} s."
    )
    return md.replace("\n## Headline comparisons", f"\n{cost}\n\n## Headline comparisons", 1)


def _add_sizing(
    cfg: Config,
    ordered: list[dict[str, Any]],
    month_list: list[str],
    headline: list[tuple[str, str]],
    target_mde_pp: float,
    workers: int,
    bootstrap: dict[str, Any] | None,
    md: str,
    payload: dict[str, Any],
    out: Path,
) -> list[str]:
    """The design sized for a whole-period MDE of ``target_mde_pp`` (size_design) added to report.json (``sizing``)
    and report.md (its table), both rewritten; returns the summary's lines, one per headline pair for which S
    replicates of every month reach it."""
    rows = size_design(cfg, ordered, month_list, headline, target_mde_pp / 100, workers, bootstrap)
    payload["sizing"] = {"target_mde_pp": target_mde_pp, "workers": workers, "rows": rows}
    _save_json(out / "report.json", payload)
    md += "\n" + "\n".join(sizing_markdown(rows, target_mde_pp, workers)) + "\n"
    (out / "report.md").write_text(md)
    return [
        f"  for an MDE of {target_mde_pp} pp on {row['a']} − {row['b']}: S = {row['replicates_needed']} "
        f"replicates of {row['months']} month(s), about {row['wall_minutes']:.0f} min on {workers} worker(s)"
        for row in rows
        if row["months"] == len(month_list) and row["replicates_needed"]
    ]


def _headline_lines(report: ReplicatedReport, headline: list[tuple[str, str]]) -> list[str]:
    """The summary's line for each headline pair over the whole period: difference, interval, p and MDE in
    percentage points (n/a with the reason where it is not defined)."""
    from abpo.abtest import replicated as rp

    lines = []
    for a, b in headline:
        t = report.diffs[rp.ALL][(a, b)]
        lines.append(
            f"- {a} − {b}: {100 * t.estimate:+.3f} pp [{100 * t.ci_low:+.3f}, {100 * t.ci_high:+.3f}], "
            f"p = {t.p:.3f}, MDE {100 * t.mde:.3f} pp ({t.replicates} replicates; SE from {t.basis or 'n/a'})"
            if t.defined
            else f"- {a} − {b}: n/a ({t.note})"
        )
    return lines


def size_design(
    cfg: Config,
    results: list[dict[str, Any]],
    months: list[str],
    pairs: list[tuple[str, str]],
    target: float,
    workers: int,
    bootstrap: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The replicates S that bring each pair's whole-period MDE to ``target`` (a fraction) with the first k months,
    k = 1..N (abpo.abtest.replicated.replicates_for_mde on this run's per-replicate variance max(s²_B, v̄_W) of
    those months, read from the replicates' warehouses; k = N from the saved moments when a state is gone), and what
    that costs from scratch: the shared bootstrap's recorded seconds + ceil(S / workers) x the replicates' mean
    seconds for k months in this run."""
    import math

    from abpo.abtest import replicated as rp
    from abpo.abtest.report import load_from_warehouse

    rows: list[dict[str, Any]] = []
    boot_s = float((bootstrap or {}).get("seconds", 0) or 0)
    for k in range(1, len(months) + 1):
        per_rep = []
        for r in results:
            house = Path(r["state"]) / "warehouse.duckdb"
            if k == len(months):
                per_rep.append(rp.moments_by_period(r["moments"]))
            elif house.exists():
                per_rep.append(rp.moments_by_period(load_from_warehouse(house, months[:k])[1].to_pylist()))
        if len(per_rep) < len(results):
            continue  # a replicate's state is gone: its first k months cannot be read
        rep_s = sum(sum(float(m["seconds"]) for m in r["months"][:k]) for r in results) / len(results)
        for a, b in pairs:
            t = rp.pair_difference(per_rep, rp.ALL, a, b, cfg.report.confidence, cfg.report.power)
            var = max(t.between_var, t.within_var) if len(results) > 1 else t.within_var
            need = rp.replicates_for_mde(target, var, cfg.report.confidence, cfg.report.power)
            rows.append(
                {
                    "months": k,
                    "a": a,
                    "b": b,
                    "sd_per_replicate_pp": 100 * math.sqrt(var) if not math.isnan(var) else None,
                    "sd_between_pp": 100 * math.sqrt(t.between_var) if not math.isnan(t.between_var) else None,
                    "sd_within_pp": 100 * math.sqrt(t.within_var) if not math.isnan(t.within_var) else None,
                    "mde_now_pp": 100 * t.mde if not math.isnan(t.mde) else None,
                    "replicates_needed": need,
                    "replicate_seconds": round(rep_s, 1),
                    "wall_minutes": (boot_s + math.ceil(need / workers) * rep_s) / 60 if need else None,
                }
            )
    return rows


def sizing_markdown(rows: list[dict[str, Any]], target_pp: float, workers: int) -> list[str]:
    def f(v: Any, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    return [
        f"## Sizing: replicates for a whole-period MDE of {target_pp} pp",
        "",
        "From this run's per-replicate variance of each pair over the first k months, max(s²_B, v̄_W) (Eq. RS of "
        f"abpo.abtest.replicated); the wall time on {workers} worker(s) = the shared bootstrap's recorded time + "
        "ceil(S / workers) x the replicates' mean seconds for k months in this run.",
        "",
        "| Months | Pair | SD per replicate (pp) | SD between / within (pp) | MDE now (pp) | S needed | est. wall (min) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['months']} | {r['a']} − {r['b']} | {f(r['sd_per_replicate_pp'], '.2f')} | "
            f"{f(r['sd_between_pp'], '.2f')} / {f(r['sd_within_pp'], '.2f')} | {f(r['mde_now_pp'], '.2f')} | "
            f"{r['replicates_needed'] or 'n/a'} | {f(r['wall_minutes'], '.0f')} |"
            for r in rows
        ),
    ]


# ------------------------------------------------------------------------------------------------ the command


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "loop-experiment",
        parents=[common],
        help="Run the monthly loop S times from one shared bootstrap and compare the arms with a two-stage interval.",
        description="Train pi_init and bootstrap every arm once, then run the monthly loop (the month driver of "
        "`abpo arms month --simulate`) --replicates times for --months months from sim.start_month, each replicate "
        "in a copy of that state with its own sim.replicate (its own traffic draws and users' arm assignment), "
        "several at once up to the machine's cores; write one report (markdown + JSON) with each arm pair's CTR "
        "difference per month and over the period, its two-stage interval (replicates, then users within a "
        "replicate), p and MDE (docs/report.md). Finished replicates are reused: rerun with a larger "
        "--replicates to add replicates.",
    )
    p.add_argument("--replicates", type=int, default=2, help="Replicates S (default 2).")
    p.add_argument("--months", type=int, default=4, help="Months per replicate from sim.start_month (default 4).")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="Replicates run at once (default: the machine's cores, at most the replicates to run); each gets "
        "cores / workers torch threads.",
    )
    p.add_argument("--out", help="Where to write report.md and report.json (default under <state>/loop-experiment).")
    p.add_argument(
        "--prune",
        action="store_true",
        help="Delete a replicate's state (warehouse, MLflow store, models) once its result is saved.",
    )
    p.add_argument(
        "--any-code",
        action="store_true",
        help="Reuse finished replicates (and the bootstrap) whatever code made them (default: only those of this "
        "code, abpo's modules less the CLI and the A/B analysis, and sql/); the report names other code.",
    )
    p.add_argument(
        "--target-mde",
        type=float,
        default=0.5,
        metavar="PP",
        help="Also size the design: the replicates (and wall time) that bring each headline pair's whole-period "
        "MDE to PP percentage points with 1..N months, from this run's variance (default 0.5; 0: no sizing).",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Config) -> int:
    out = run_loop_experiment(
        cfg,
        config_ref=args.config,
        overrides=list(args.overrides or []),
        replicates=args.replicates,
        months=args.months,
        workers=args.workers,
        out_dir=args.out,
        prune=args.prune,
        any_code=args.any_code,
        target_mde_pp=args.target_mde,
    )
    print(f"\nabpo loop-experiment: {len(out.replicates)} replicate(s) in {out.seconds / 60:.1f} min; whole period:")
    print("\n".join(out.summary))
    print(f"  report {out.markdown}\n         {out.json}")
    return 0
