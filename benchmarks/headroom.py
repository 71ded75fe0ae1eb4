"""Headroom first: what any update could gain in the loop. Per month of a run (the demo's by
default: run `make demo` first, or name another config's state with --config/--set), on the month's served requests
(the same users, histories and retrieval candidate sets the simulator served, abpo.sim.simulator.month_requests),
the expected simulated CTR (abpo.sim.headroom, Eq. H1: the click model's probabilities, no click noise) of

    oracle-greedy      each request's best candidate under the click model (the ceiling of any ranker, Eq. H2)
    pi_init            the first LLM arm's version 1 (pi_init, at that arm's exposure temperature)
    <arm> champion     each arm's champion at the month's start (the version that served the month), on every
                       request of the month, not only its own users'
    random candidate   a uniformly random candidate (the floor, Eq. H3)

and the share of the floor-to-oracle gap each closes. Every row scores the same requests with the same click
probabilities, so row differences carry no click noise.

``--online-bound ARM`` adds two rows per month, both trained from ARM's champion at the month's start on the month's
served rows (the simulator serves the month again with the month's champions, nothing landed; every arm's rows, as
arms.update_logs = all reads them) with the arm's update settings (arms.update_max_examples rows, the config's
steps and learning rate):

    <ARM> update (logged reward)       ARM's own variant with the paper's reward: the month's update, recomputed
    online bound (sim reward, grpo)    vanilla GRPO with every rollout rewarded by the simulator's click
                                       probability of the candidate it names (abpo.train reward = simulated_click):
                                       the simulator as reward model, a diagnostic, never registered or served

    .venv/bin/python benchmarks/headroom.py [--config demo] [--months 2026-01,2026-02] [--set key=value ...]
                                            [--online-bound abpo [--record]] [--json out.json] [--smoke]

``--record`` (with --online-bound) stores each month's bound in the state, beside the expected-CTR figures the
serve step stored for the month (``<paths.root>/sim/expected_ctr/<YYYY-MM>.online_bound.json``, abpo.abtest.sim_ctr),
so that a report built afterwards draws it as a reference line: the online bound and the arm's logged-reward update,
each scored on the requests the serve step scored for the month (abpo.sim.expected_ctr, the same sample as the
arms' figures), with their figures on every request of the month. It is refused, before anything is trained, for a
month whose figures the state does not hold (not simulated there), whose requests differ from those the month served
(another config, or a ``--set sim.*`` override), or whose champions at the month's start were not recorded.

A month the state has not run (no champion recorded at its start) uses each arm's current champion, marked
"(current)". The last line is exactly
`Headroom oracle-greedy - pi_init: <+x.xx> pp; best champion - pi_init: <+y.yy> pp (mean over <n> month(s))`.

Why a script here and not an `abpo` subcommand: like benchmarks/simulate.py it reads a finished run's registry and
the simulator's ground truth, a diagnostic of the loop rather than a step of it (it lands, registers and promotes
nothing), and the simulator's ground truth must stay out of `abpo.commands` (the import-linter contract "The
simulated users' ground truth is the simulator's alone").

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py) without `make demo`: in a throw-away state
directory, on 12 users and a smaller tiny model, it bootstraps every arm first (pi_init by 4 SFT steps, the rankers
fitted), then prints the first month's headroom (the figures mean nothing at that size; the smoke case adds
``--online-bound abpo``, 4 steps per update).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the arms bootstrapped on 12 users with a smaller tiny model (overrides before the command line's --set)
SMOKE = [
    "data.max_users=12",
    "data.sup_examples_per_user=4",
    "data.train_candidates=8",
    "data.eval_candidates=10",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
    "update.max_completion_length=72",  # the catalog's longest answer + EOS in a 2,048-token vocabulary: 69
    "policy.max_history=3",
    "sft.pretrain_epochs=0",
    "sft.max_steps=4",
    "sft.batch_size=8",
    "sft.eval_max_users=4",
    "sft.eval_generation=false",
    "arms.gate_max_users=4",
    "arms.update_max_examples=64",  # --online-bound: 4 steps of 16 per update
]
BOUND = "online bound (sim reward, grpo)"  # the online bound's row (label of :func:`online_bound`)


def month_start_version(cfg, arm: str, month: str) -> tuple[str, bool]:
    """(version, recorded): the arm's champion at ``month``'s start as its bootstrap step recorded it
    (abpo.monthly.common.MONTH_START_TAG), or the current champion with recorded False (a month this state has not
    run)."""
    from abpo import registry
    from abpo.arms import versions
    from abpo.monthly.common import MONTH_START_TAG

    try:
        kept = (registry.model_tags(cfg, versions.model_name(arm, cfg)) or {}).get(MONTH_START_TAG + month)
    except registry.RegistryUnavailable:
        kept = None
    if kept:
        return str(kept), True
    mv = versions.get_version(cfg, arm)
    if mv is None:
        raise LookupError(f"{versions.model_name(arm, cfg)}: no champion; bootstrap the arms first")
    return str(mv.version), False


def pi_init_arm(cfg, dataset):
    """pi_init as the first updated LLM arm serves it: that arm's version 1, which its bootstrap registered from
    pi_init (tag source = pi_init; anything else is refused, naming the version's source)."""
    from abpo.arms import versions
    from abpo.arms.names import LLM, arm_class, entry
    from abpo.monthly.common import arms_of

    llm = [a for a in arms_of(cfg) if entry(a).kind == LLM]
    if not llm:
        raise ValueError(f"config arms.names = {cfg.arms.names}: no updated LLM arm; rule: one to read pi_init from")
    arm = llm[0]
    mv = versions.get_version(cfg, arm, "1")
    if mv is None:
        raise LookupError(f"{versions.model_name(arm, cfg)}: no version 1; bootstrap the arms first")
    source = (mv.tags or {}).get("source", "")
    if source != "pi_init":
        raise ValueError(f"{versions.model_name(arm, cfg)} v1: source {source!r}; rule: version 1 is pi_init")
    return arm_class(arm).load(arm, versions.local_dir(cfg, arm, "1"), cfg, dataset=dataset, model_version="1")


def served_month_strata(cfg, month: str, served: dict, *, dataset, splits, requests, probs):
    """(positive, no_response): the month's impressions as the simulator serves them with ``served`` (arm ->
    champion; abpo.sim.simulator.simulate_month, nothing landed: the same rows a run landed for the month when these
    are its champions), every arm's rows (arms.update_logs = all), each with the column candidate_click_prob (the
    click model's probability of each of its candidates, ``probs`` of ``requests`` joined on request_id)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from abpo.sim.simulator import simulate_month

    table = simulate_month(cfg, month, served, dataset=dataset, splits=splits, write=False).table
    by_id = {r.request_id: p for r, p in zip(requests, probs, strict=True)}
    col = pa.array([by_id[rid].tolist() for rid in table.column("request_id").to_pylist()], pa.list_(pa.float64()))
    table = table.append_column("candidate_click_prob", col)
    return table.filter(pc.equal(table["clicked"], 1)), table.filter(pc.equal(table["clicked"], 0))


def online_bound(
    cfg, month: str, arm: str, parent: str, strata, dataset, *, seed: int | None = None
) -> dict[str, object]:
    """Two updates from ``arm``'s version ``parent`` on the same rows, steps and learning rate as the arm's monthly
    update (abpo.arms.llm.LLMArm.refresh's settings: arms.update_max_examples rows, the config's update section):
    the arm's own variant with the paper's logged reward (the month's update, recomputed), and vanilla GRPO with
    every rollout rewarded by the simulator's click probability (abpo.train: reward = simulated_click), the online
    upper bound: a diagnostic, never registered or served. ``seed``: the updates' seed (their row subsample,
    batch order and rollouts; default the config's), the simulated month staying the config seed's. Returns label ->
    the trained policy (an LLMArm)."""
    import dataclasses

    from abpo.arms import versions
    from abpo.arms.names import arm_class, entry
    from abpo.train.runs import UpdateRun
    from abpo.train.update import run_update

    u = dataclasses.replace(
        cfg.update, resume=False, save_merged=True, max_examples=cfg.arms.update_max_examples or cfg.update.max_examples
    )
    s = cfg.seed if seed is None else int(seed)
    c = dataclasses.replace(cfg, update=u, seed=s)
    out = {}
    for label, variant, reward in (
        (f"{arm} update (logged reward)", entry(arm).refreshed_by, "logged"),
        (BOUND, "grpo", "simulated_click"),
    ):
        t = time.perf_counter()
        run = UpdateRun(
            variant=variant,
            arm=arm,
            months=(month,),
            init_model=versions.local_dir(cfg, arm, parent),
            output=Path("headroom") / arm / month / f"{reward}-seed{s}",
        )
        res = run_update(c, run, progress=False, strata=strata, log_mlflow=False, reward=reward)
        print(
            f"  {label}: {res.global_step} steps from {arm} v{parent} on {strata[0].num_rows} + {strata[1].num_rows} "
            f"rows (update.max_examples {u.max_examples}, lr {u.learning_rate}, seed {s}) in "
            f"{time.perf_counter() - t:.0f}s"
        )
        out[label] = arm_class(arm).load(
            arm, res.model_dir, cfg, dataset=dataset, model_version=f"{variant}@{month}/seed{s}"
        )
    return out


def check_recordable(cfg, month: str, requests, recorded: bool) -> None:
    """--record: refuse ``month`` (ValueError naming the file and the rule) unless the state holds its expected-CTR
    figures on these very ``requests`` and recorded the arms' champions at its start (checked before training)."""
    from abpo.abtest.sim_ctr import figures_path, read_month_figures
    from abpo.sim.expected_ctr import requests_sha256

    figures = read_month_figures(cfg, month)
    if figures is None:
        raise ValueError(
            f"--record {month}: {figures_path(cfg, month)}: no expected-CTR figures; rule: a month the serve step "
            "simulated in this state (paths.root)"
        )
    if figures["requests"]["sha256"] != requests_sha256(requests):
        raise ValueError(
            f"--record {month}: {figures_path(cfg, month)}: requests.sha256 differs from this run's "
            f"{len(requests)} requests; rule: the requests the month served (the run's config, no sim.* override)"
        )
    if not recorded:
        raise ValueError(
            f"--record {month}: the champions at the month's start are not recorded in this state (abpo.month_start "
            "tags); rule: a month this state ran"
        )


def record_bound(cfg, month: str, arm: str, parent: str, requests, trained: dict, res, dataset, *, seed) -> Path:
    """--record: the month's online bound and ``arm``'s logged-reward update (``trained``, label -> policy, from
    :func:`online_bound`) scored on the month's scored requests (abpo.sim.expected_ctr.sample_scores, the month's
    intercept ``res.intercept``), with their figures on every request (``res``, the month's headroom rows), stored
    beside the month's figures (abpo.abtest.sim_ctr.write_online_bound). Returns the file written."""
    from abpo.abtest.sim_ctr import write_online_bound
    from abpo.sim.expected_ctr import requests_sha256, sample_scores

    logged = f"{arm} update (logged reward)"
    scores = sample_scores(
        cfg,
        month,
        requests,
        {"bound": trained[BOUND], "logged": trained[logged]},
        dataset=dataset,
        intercept=res.intercept,
    )
    u = cfg.arms.update_max_examples or cfg.update.max_examples  # the rows online_bound trains on
    return write_online_bound(
        cfg,
        month,
        {
            "month": month,
            "arm": arm,
            "parent_version": str(parent),
            "requests_sha256": requests_sha256(requests),
            "online_bound": scores["bound"],
            "logged_update": scores["logged"],
            "all_requests": {
                "requests": res.requests,
                "online_bound": round(res.row(BOUND).ctr, 6),
                "logged_update": round(res.row(logged).ctr, 6),
                "pi_init": round(res.row("pi_init").ctr, 6),
            },
            "update": {"max_examples": u, "learning_rate": cfg.update.learning_rate, "seed": int(seed)},
            "what": "the online bound (vanilla GRPO rewarded by the simulator's click probability) and the arm's "
            "update with the logged reward, trained from the arm's champion at the month's start on the month's "
            "rows; expected CTR (Eq. H1) on the serve step's scored requests; all_requests: on every request",
        },
    )


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset whose registry holds the run (default demo)")
    ap.add_argument(
        "--months",
        default="",
        help="comma-separated YYYY-MM (default: every month the config's data.update_steps // sim.window allows "
        "from sim.start_month)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--json", default="", help="also write the rows as JSON to this file")
    ap.add_argument(
        "--online-bound",
        default="",
        metavar="ARM",
        help="also train, per month, the online upper bound for LLM arm ARM (e.g. abpo) from its champion at the "
        "month's start: its update recomputed with the logged reward, and vanilla GRPO on the same rows, steps and "
        "learning rate with each rollout rewarded by the simulator's click probability; both scored as rows "
        "(written under <paths.models>/headroom/, never registered)",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="--online-bound: store each month's bound beside the month's expected-CTR figures in the state "
        "(<paths.root>/sim/expected_ctr/<YYYY-MM>.online_bound.json), where the report draws it; refused for a month "
        "the state did not simulate or on other requests than it served",
    )
    ap.add_argument(
        "--update-seed",
        type=int,
        default=None,
        help="--online-bound: the two updates' seed (row subsample, batch order, rollouts); default the config's "
        "seed. The month's requests and clicks stay the config seed's, so seeds measure the updates' own noise",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="bootstrap the arms of a tiny throw-away state first, then its first month (seconds; the figures mean "
        "nothing)",
    )
    args = ap.parse_args(argv)
    if args.record and not args.online_bound:
        ap.error("--record stores the online bound: it needs --online-bound ARM")

    import tempfile

    from abpo.arms import versions
    from abpo.arms.names import LLM, arm_class, entry
    from abpo.config import load_config
    from abpo.monthly.common import arms_of, dataset_and_splits
    from abpo.months import Month
    from abpo.sim.headroom import (
        ORACLE_GREEDY,
        candidate_click_probabilities,
        headroom_markdown,
        month_headroom,
    )
    from abpo.sim.simulator import month_requests, months_available

    t0 = time.perf_counter()
    state = ""
    if args.smoke:
        state = tempfile.mkdtemp(prefix="abpo-bench-headroom-")
        cfg = load_config(args.config, [*SMOKE, f"paths.root={state}", *args.set])
        from abpo.logs import quiet
        from abpo.monthly.bootstrap import bootstrap_arms

        with quiet():
            bootstrap_arms(cfg)
        print(f"--smoke: every arm bootstrapped in {state} (removed at the end)")
    else:
        cfg = load_config(args.config, args.set)
    ds, splits = dataset_and_splits(cfg)
    if args.months:
        months = [str(Month(m.strip(), "--months")) for m in args.months.split(",") if m.strip()]
    else:
        n = 1 if args.smoke else months_available(cfg)
        months = [str(Month(cfg.sim.start_month).plus(k)) for k in range(n)]
    print(
        f"headroom of config {cfg.name} (seed {cfg.seed}) in {cfg.paths.resolve('root')}: months {months}; "
        f"{len(splits)} users x sim.requests_per_user {cfg.sim.requests_per_user}, candidates {cfg.sim.candidates} "
        f"(M = {cfg.sim.candidate_count}), sim.oracle {cfg.sim.oracle}, sim.base_ctr {cfg.sim.base_ctr}"
    )
    loaded: dict[tuple[str, str], object] = {}
    init = pi_init_arm(cfg, ds)
    results = []
    for month in months:
        t = time.perf_counter()
        policies = {"pi_init": init}
        for arm in arms_of(cfg):
            v, recorded = month_start_version(cfg, arm, month)
            if (arm, v) not in loaded:
                loaded[(arm, v)] = arm_class(arm).load(
                    arm, versions.local_dir(cfg, arm, v), cfg, dataset=ds, model_version=v
                )
            policies[f"{arm} champion" + ("" if recorded else " (current)")] = loaded[(arm, v)]
        requests = month_requests(cfg, ds, splits, month)
        if args.online_bound:
            if entry(args.online_bound).kind != LLM:
                raise ValueError(
                    f"--online-bound {args.online_bound}: a {entry(args.online_bound).kind} arm; rule: an updated LLM arm"
                )
            if args.record:
                check_recordable(cfg, month, requests, all(month_start_version(cfg, a, month)[1] for a in arms_of(cfg)))
            served = {a: loaded[(a, month_start_version(cfg, a, month)[0])] for a in arms_of(cfg)}
            probs, _ = candidate_click_probabilities(cfg, ds, requests)
            strata = served_month_strata(cfg, month, served, dataset=ds, splits=splits, requests=requests, probs=probs)
            parent = month_start_version(cfg, args.online_bound, month)[0]
            trained = online_bound(cfg, month, args.online_bound, parent, strata, ds, seed=args.update_seed)
            policies.update(trained)
        res = month_headroom(cfg, month, policies, dataset=ds, splits=splits, requests=requests)
        results.append(res)
        if args.record:
            seed = cfg.seed if args.update_seed is None else args.update_seed
            path = record_bound(cfg, month, args.online_bound, parent, requests, trained, res, ds, seed=seed)
            print(f"  recorded for the report: {path}")
        print(
            f"\n{month}: {res.requests} requests, preference intercept {res.intercept:.3f}, {time.perf_counter() - t:.0f}s"
        )
        print(f"{'policy':<30} {'version':>7} {'exp. CTR %':>10} {'gap closed':>10} {'seconds':>8}")
        for r in res.rows:
            print(f"{r.policy:<30} {r.version or '-':>7} {100 * r.ctr:>10.2f} {r.gap_closed:>10.3f} {r.seconds:>8.1f}")
    print("\n" + headroom_markdown(results) + "\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": cfg.name,
                    "seed": cfg.seed,
                    "overrides": list(args.set),
                    "months": [
                        {
                            "month": m.month,
                            "requests": m.requests,
                            "intercept": m.intercept,
                            "rows": [r.to_json() for r in m.rows],
                        }
                        for m in results
                    ],
                },
                indent=1,
            )
        )
    if args.smoke:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    gap = [m.row(ORACLE_GREEDY).ctr - m.row("pi_init").ctr for m in results]
    best = [max(r.ctr for r in m.rows if " champion" in r.policy) - m.row("pi_init").ctr for m in results]
    if args.online_bound:
        bound = [m.row(BOUND).ctr - m.row("pi_init").ctr for m in results]
        logged = [m.row(f"{args.online_bound} update (logged reward)").ctr - m.row("pi_init").ctr for m in results]
        print(
            f"online bound - pi_init: {100 * sum(bound) / len(bound):+.2f} pp; {args.online_bound} update (logged "
            f"reward) - pi_init: {100 * sum(logged) / len(logged):+.2f} pp (mean over {len(results)} month(s))"
        )
    print(f"wall time {time.perf_counter() - t0:.0f}s")
    print(
        f"Headroom oracle-greedy - pi_init: {100 * sum(gap) / len(gap):+.2f} pp; best champion - pi_init: "
        f"{100 * sum(best) / len(best):+.2f} pp (mean over {len(results)} month(s))"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
