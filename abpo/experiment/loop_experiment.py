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

Its parts: abpo.experiment.loop_fingerprints (fingerprints, the code digest, saved results),
abpo.experiment.loop_workers (the jobs, the worker processes and their pool), abpo.experiment.loop_report (the
analysis, report.md, the sizing); this module plans the replicates, runs them and writes the report.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment import loop_fingerprints as fingerprints
from abpo.experiment.loop_fingerprints import (
    bootstrap_fingerprint,
    digest,
    load_result,
    replicate_fingerprint,
    save_json,
    settings_of,
    start_over_unless,
)
from abpo.experiment.loop_report import add_sizing, analyse, headline_lines, report_markdown
from abpo.experiment.loop_workers import Job, cores, run_bootstrap, run_replicate, worker_pool

if TYPE_CHECKING:
    from abpo.config import Config

DIR = "loop-experiment"
# what report.json keeps of each replicate's result
REPORTED_REPLICATE_KEYS = ("replicate", "fingerprint", "code", "salt", "seconds", "threads", "months")


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
    ``sim.start_month``, ``workers`` processes at once (0: min(cores, replicates to run))."""
    from abpo.months import month_range

    _check_request(cfg, replicates, months)
    t0 = time.time()
    month_list = [str(m) for m in month_range(cfg.sim.start_month, months)]
    root = cfg.paths.resolve("root") / DIR
    code = fingerprints.code_digest()
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
