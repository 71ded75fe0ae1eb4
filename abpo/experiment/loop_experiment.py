"""The replicated loop experiment (`abpo loop-experiment`): the monthly loop run S times from one shared bootstrap,
compared arm against arm with a two-stage interval (replicates, then users within a replicate;
abpo.abtest.replicated, docs/report.md "The replicated loop experiment").

    shared bootstrap (once per bootstrap fingerprint; a worker process): pi_init's SFT, every arm's first champion,
    the ranker fits and pi_init's gate scores, in a state of its own (abpo.monthly.bootstrap.bootstrap_arms)
    -> replicate r = 0..S-1 (worker processes, up to the machine's cores at once): a copy of that state,
       relocated (abpo.registry.relocate_state), with sim.replicate = r (its own traffic draws and users' arm
       assignment, abpo.sim.simulator.series_salt), runs the months with the month driver of `abpo arms month
       --simulate` (abpo.monthly.month.run_month: serve, ingest, update, register, gate, promote, refit, hold,
       report), then saves its per-user moments per arm and month (sql/report_user_moments.sql) as its result
    -> one report (markdown + JSON) over the replicates' results.

A replicate's result is keyed by its fingerprint, the config (less paths and thread counts) with its
``sim.replicate`` and the months, and records the code that made it (abpo.experiment.loop_fingerprints.code_digest:
abpo's modules less the commands, the A/B analysis and these loop_* modules, and sql/). A rerun with a larger S, or
the same S, reuses every replicate whose fingerprint has a result made by this code (``--any-code``: by any code,
named in the report); a replicate interrupted mid-way resumes at its first unfinished month (months are
idempotent); one that other code began starts over. The shared bootstrap likewise (its fingerprint: the settings it
reads).

Layout under ``<paths.root>/loop-experiment/``: ``bootstrap/<fingerprint>/`` (the shared state, ``done.json``),
``replicates/<fingerprint>/`` (a replicate's state, ``run.log``, ``result.json``), ``reports/<label>/``
(``report.md``, ``report.json``).

One run per state: a run holds ``loop-experiment/run.lock``, which names it, from its planning to its report
(abpo.experiment.loop_lock); its workers die with it (abpo.experiment.loop_workers.die_with_parent). A worker returns
its result to the run, and only the run writes it, recording its own id and ``clean: true``; a rerun reuses only a
result with that record (a result.json without it, as a worker that outlived its run wrote one, starts its replicate
over). Every argument, and every saved result a run would reuse, is checked before any work
(abpo.experiment.loop_checks).

Its parts: abpo.experiment.loop_fingerprints (fingerprints, the code digest, saved results),
abpo.experiment.loop_checks (the checks before any work), abpo.experiment.loop_lock (the run's and the workers'
locks), abpo.experiment.loop_workers (the jobs, the worker processes and their pool), abpo.experiment.loop_report
(the analysis, report.md, the sizing); this module plans the replicates, runs them and writes the report.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment import loop_fingerprints as fingerprints
from abpo.experiment.loop_checks import check_bootstrap, check_request, check_result, finished_cleanly
from abpo.experiment.loop_fingerprints import (
    bootstrap_fingerprint,
    digest,
    load_result,
    replicate_fingerprint,
    save_json,
    settings_of,
    start_over_unless,
)
from abpo.experiment.loop_lock import run_lock
from abpo.experiment.loop_report import add_sizing, analyse, headline_lines, report_markdown
from abpo.experiment.loop_workers import Job, cores, run_bootstrap, run_replicate, worker_pool

if TYPE_CHECKING:
    from abpo.config import Config

DIR = "loop-experiment"
# what report.json keeps of each replicate's result
REPORTED_REPLICATE_KEYS = ("replicate", "fingerprint", "code", "run", "salt", "seconds", "threads", "months")


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
    ``sim.start_month``, ``workers`` processes at once (0: min(cores, replicates to run)). Every argument is checked
    before any work (loop_checks.check_request), then the run holds the state's lock (loop_lock.run_lock) to its
    end."""
    from abpo.months import month_range

    check_request(
        cfg, replicates=replicates, months=months, workers=workers, target_mde_pp=target_mde_pp, out_dir=out_dir
    )
    month_list = [str(m) for m in month_range(cfg.sim.start_month, months)]
    root = cfg.paths.resolve("root") / DIR
    what = f"abpo loop-experiment --config {config_ref} --replicates {replicates} --months {months}"
    with run_lock(root, what) as run:
        return _run_locked(
            cfg, run, config_ref=config_ref, overrides=overrides, replicates=replicates, months=months,
            month_list=month_list, root=root, workers=workers, out_dir=out_dir, prune=prune, any_code=any_code,
            target_mde_pp=target_mde_pp, echo=echo,
        )  # fmt: skip


def _run_locked(
    cfg: Config,
    run: str,
    *,
    config_ref: str,
    overrides: list[str],
    replicates: int,
    months: int,
    month_list: list[str],
    root: Path,
    workers: int,
    out_dir: str | Path | None,
    prune: bool,
    any_code: bool,
    target_mde_pp: float,
    echo,
) -> LoopExperiment:
    """The experiment, under the state's lock held by ``run``."""
    t0 = time.time()
    code = fingerprints.code_digest()
    sets = tuple(o for o in overrides if not o.split("=", 1)[0].strip().startswith("paths."))
    b_fp = bootstrap_fingerprint(cfg)
    b_dir = root / "bootstrap" / b_fp
    bootstrap = _trusted_bootstrap(b_dir, b_fp, None if any_code else code)
    results, rep_jobs = _plan_replicates(
        cfg, config_ref, sets, replicates, month_list, root, b_dir, code, any_code, echo=echo
    )
    reused = sorted(results)
    n_workers = max(1, min(workers or cores(), max(len(rep_jobs), 1)))
    threads = max(1, cores() // n_workers)  # torch threads per replicate: the cores shared out
    rep_jobs = [dataclasses.replace(j, threads=threads, run=run) for j in rep_jobs]
    echo(
        f"abpo loop-experiment: {replicates} replicate(s) x {months} month(s) ({month_list[0]}..{month_list[-1]}), "
        f"{len(reused)} finished before, {len(rep_jobs)} to run on {n_workers} worker(s) x {threads} thread(s); "
        f"under {root}"
    )
    if bootstrap is None and rep_jobs:
        start_over_unless(b_dir, code)
    bootstrap_reused = bootstrap is not None
    if rep_jobs:
        with worker_pool(n_workers, threads) as pool:
            if bootstrap is None:
                bootstrap = _shared_bootstrap(pool, cfg, config_ref, sets, b_dir, b_fp, code, run, echo)
            _run_replicates(pool, rep_jobs, results, replicates, run=run, prune=prune, t0=t0, echo=echo)
    elif bootstrap is None:
        bootstrap = {"note": "every replicate was finished before; its shared bootstrap is not on this machine"}
    ordered = [results[r] for r in range(replicates)]
    report, headline = analyse(cfg, ordered, month_list)
    label = f"{month_list[0]}..{month_list[-1]}-S{replicates}-{digest(settings_of(cfg))[:8]}"
    out = Path(out_dir) if out_dir else root / "reports" / label
    out.mkdir(parents=True, exist_ok=True)
    wall = time.time() - t0
    md = report_markdown(
        cfg, report, headline, ordered, code, replicates=replicates, months=months, wall=wall, workers=n_workers,
        ran=len(rep_jobs), reused=len(reused), bootstrap=bootstrap, bootstrap_reused=bootstrap_reused,
    )  # fmt: skip
    (out / "report.md").write_text(md)
    payload = {
        "config": config_ref,
        "overrides": list(overrides),
        "months": month_list,
        "run": run,
        "replicates": [{k: r.get(k) for k in REPORTED_REPLICATE_KEYS} for r in ordered],
        "reused": reused,
        "bootstrap": {**(bootstrap or {}), "reused": bootstrap_reused, "fingerprint": b_fp},
        "code": code,
        "workers": n_workers,
        "cores": cores(),
        "seconds": round(wall, 1),
        "analysis": report.to_json(),
    }
    save_json(out / "report.json", payload)
    sizing: list[str] = []
    if target_mde_pp > 0:
        sizing = add_sizing(cfg, ordered, month_list, headline, target_mde_pp, n_workers, bootstrap, md, payload, out)
    return LoopExperiment(
        month_list, ordered, reused, bootstrap or {}, bootstrap_reused, n_workers, wall, out / "report.md",
        out / "report.json", headline_lines(report, headline) + sizing,
    )  # fmt: skip


def _trusted_bootstrap(b_dir: Path, b_fp: str, code: str | None) -> dict[str, Any] | None:
    """The shared bootstrap's ``done.json`` when a run recorded it finished cleanly (loop_checks.finished_cleanly),
    with this fingerprint and ``code`` (None: any); else None (it runs again). A damaged one is refused."""
    path, remedy = b_dir / "done.json", f"remove {b_dir} to run the shared bootstrap again"
    got = load_result(path, b_fp, code, remedy=remedy)
    if got is None or not finished_cleanly(got):
        return None
    check_bootstrap(path, got, remedy)
    return got


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
    *,
    echo=print,
) -> tuple[dict[int, dict[str, Any]], list[Job]]:
    """(the results of the replicates 0..S-1 found finished, by replicate: made by this ``code``, or by any with
    ``any_code``, and recorded as finished cleanly by the run that held the lock (loop_checks.finished_cleanly); a
    job for each of the others, one thread each until the cores are shared out). Every saved result is read and
    checked first (a damaged one refuses the run before anything changes); then a result without that record is
    removed with its folder (said on ``echo``), and a replicate's folder that other code began is started over
    (start_over_unless)."""
    found: list[tuple[int, str, dict[str, Any] | None]] = []
    for r in range(replicates):
        rcfg = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, replicate=r))
        fp = replicate_fingerprint(rcfg, month_list)
        path, remedy = (
            root / "replicates" / fp / "result.json",
            f"remove {root / 'replicates' / fp} to run replicate {r} again",
        )
        got = load_result(path, fp, None if any_code else code, remedy=remedy)
        if got is not None:
            check_result(path, got, month_list, r, remedy)
        found.append((r, fp, got))
    results: dict[int, dict[str, Any]] = {}
    jobs: list[Job] = []
    for r, fp, got in found:
        folder = root / "replicates" / fp
        if got is not None and finished_cleanly(got):
            results[r] = got
            continue
        if got is not None:
            echo(
                f"replicate {r}: {folder / 'result.json'} is not recorded as finished cleanly by a run (no run id "
                "and clean: true; a worker that outlived its run wrote it?): not reused, the replicate starts over"
            )
            shutil.rmtree(folder)
        start_over_unless(folder, code)
        jobs.append(
            Job(config_ref, sets, str(folder / "state"), 1, r, tuple(month_list), str(b_dir / "state"), fp, code)
        )
    return results, jobs


def _shared_bootstrap(
    pool: Any, cfg: Config, config_ref: str, sets: tuple[str, ...], b_dir: Path, b_fp: str, code: str, run: str, echo
) -> dict[str, Any]:
    """The shared bootstrap (run_bootstrap) in a worker of ``pool``, from an empty ``<b_dir>/state`` (an interrupted
    one starts over) with the config's torch threads (0: every core); returns its result, recorded as ``done.json``
    with the ``run`` that received it (clean)."""
    base_threads = max(1, int(cfg.policy.num_threads) or cores())
    echo(f"[bootstrap] pi_init and every arm's first champion, once: log {b_dir / 'bootstrap.log'}")
    job = Job(config_ref, sets, str(b_dir / "state"), base_threads, fingerprint=b_fp, code=code, run=run)
    shutil.rmtree(b_dir / "state", ignore_errors=True)  # an interrupted bootstrap starts over
    bootstrap = {**pool.submit(run_bootstrap, job).result(), "run": run, "clean": True}
    save_json(b_dir / "done.json", bootstrap)
    echo(f"[bootstrap] done in {bootstrap['seconds']:.0f}s")
    return bootstrap


def _run_replicates(
    pool: Any,
    jobs: list[Job],
    results: dict[int, dict[str, Any]],
    replicates: int,
    *,
    run: str,
    prune: bool,
    t0: float,
    echo,
) -> None:
    """Run the replicates' ``jobs`` (run_replicate) in the workers of ``pool``, recording each result as it finishes
    (``result.json`` with the ``run`` that received it, clean) and adding it to ``results`` (its state deleted with
    ``prune``). A failed replicate cancels those not started and stops the run, naming its log; the finished ones
    are kept."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = {pool.submit(run_replicate, j): j for j in jobs}
    while pending:
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for fut in finished:
            j = pending.pop(fut)
            try:
                res = {**fut.result(), "run": run, "clean": True}
            except Exception as e:
                for waiting in pending:
                    waiting.cancel()
                raise RuntimeError(
                    f"replicate {j.replicate} failed ({type(e).__name__}: {e}); its log: "
                    f"{Path(j.state).parent / 'run.log'}; the finished replicates are kept"
                ) from e
            save_json(Path(j.state).parent / "result.json", res)
            results[j.replicate] = res
            secs = ", ".join(f"{m['seconds']:.0f}" for m in res["months"])
            echo(
                f"[replicate {j.replicate}] done in {res['seconds']:.0f}s (months {secs} s; "
                f"{len(results)}/{replicates} finished, {time.time() - t0:.0f}s elapsed)"
            )
            if prune:
                shutil.rmtree(j.state, ignore_errors=True)
