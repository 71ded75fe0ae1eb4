"""The update's budget curve: expected simulated CTR gained over pi_init as a function of the
update budget (rows, epochs, learning rate, schedule), for the online bound and the logged-reward updates, on a
**validation** series, with the rule that picks the loop's configuration fixed in this docstring before any cell ran.

The setting. A state bootstrapped on the validation series (the demo config with ``seed=1`` and
``sim.salt=validation-series``, as docs/loop.md "Sizing the update" fixed it: other traffic draws, arm assignment,
candidates and clicks than the reported series, which uses seed 0; pi_init trained with seed 1). Its first month
(``--train-month``, default 2026-01) is served by the first champions (benchmarks/headroom.py's
``served_month_strata``: every arm's rows, as ``arms.update_logs = all`` reads them, nothing landed). Each cell trains
one update from pi_init on those rows and is scored on the **next** month's served requests (``--score-month``,
default 2026-02: the same users, their histories two items on, new candidate sets: what the updated champion would
serve), by Eq. H1 of abpo.sim.headroom (no click noise), at each exposure temperature of ``--taus``. The cells' rows,
clicks and scoring requests are the same for every cell, so cell differences carry no click noise; what remains is
the update's own noise (its row order and rollouts: ``--update-seed``).

A cell: ``variant`` (abpo = F, grpo = B, grpo_cr = G, abpo_ll = I, wll = J, docs/update-variants.md), the reward
(``logged``: the paper's, from the logged clicks; ``sim``: the online bound, vanilla GRPO whose rollouts are rewarded
by the simulator's click probability, a diagnostic never deployable), rows (``arms.update_max_examples``; 0 = all of
the month's rows), epochs (``update.epochs``), learning rate and schedule (``update.learning_rate``,
``update.lr_scheduler_type``). Each cell records its optimizer steps, wall and process CPU seconds (the update only;
the scoring apart), and its expected CTR at every tau of ``--taus``.

**The rule (fixed 2026-11-29 before any cell ran; code: :func:`choose`).** Among the deployable cells (reward
``logged``) whose update costs at most ``--cpu-budget`` process CPU seconds (default 600: the demo's four months and
three LLM arms must fit its 15 minutes), take the one with the largest expected-CTR gain over pi_init at the loop's
exposure temperature (the first of ``--taus``, the config's ``policy.tau``), measured on the score month; a tie
within 0.05 points goes to the cheaper cell. The online bound's cells are the reference (where the curve stops
rising), never chosen. The exposure temperature is chosen by the same rule across runs of this script at several
``policy.tau`` (the month served, logged and updated at that tau, ``--set policy.tau=X``): the tau whose chosen cell's
expected CTR (absolute, at that tau) is highest, provided the off-policy gate can still see a difference there
(benchmarks/ope_coverage.py at that tau: coverage of its DR interval at least 0.90); otherwise the next tau.

    ABPO_STATE=/tmp/val/state .venv/bin/python benchmarks/budget_curve.py --config demo --set seed=1 \\
        --set sim.salt=validation-series --out /tmp/val/curve [--cells NAME[,NAME ...]] [--taus 1,0.5,0.25] \\
        [--update-seed 0] [--list] [--choose]

``--out`` keeps one JSON per finished cell (``cells/<name>.json``), reused on a rerun whose cell, config overrides,
months and seed match (a finished cell is never trained twice), and ``curve.md``, the table. ``--list`` prints the
grid's cells; ``--choose`` applies the rule to the finished cells and writes ``choice.json``.
``--smoke`` runs one cell of each reward in seconds in a throw-away tiny state (tests/benchmarks/test_smoke.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headroom import SMOKE as HEADROOM_SMOKE  # noqa: E402  (benchmarks/ is on the path just above)


@dataclasses.dataclass(frozen=True)
class Cell:
    variant: str
    reward: str  # "logged" | "sim"
    rows: int  # 0 = every row of the month
    epochs: float = 1.0
    lr: float = 1e-4
    schedule: str = "linear"

    @property
    def name(self) -> str:
        rows = "all" if self.rows == 0 else str(self.rows)
        sched = "" if self.schedule == "linear" else f"-{self.schedule}"
        ep = f"{self.epochs:g}"
        return f"{self.variant}-{self.reward}-r{rows}-e{ep}-lr{self.lr:g}{sched}"

    def overrides(self) -> list[str]:
        """The cell as the loop's config keys (what an arm would set to run it)."""
        return [
            f"arms.update_max_examples={self.rows}",
            f"update.epochs={self.epochs:g}",
            f"update.learning_rate={self.lr:g}",
            f"update.lr_scheduler_type={self.schedule}",
        ]


def grid() -> list[Cell]:
    """The grid, in the order it runs (cheapest first within a stage): stage 1 the learning rate at the demo's
    1,024 rows; stage 2 every row of the month; stage 3 several epochs over the month; stages 4-6 added as noted."""
    cells: list[Cell] = []
    for lr in (1e-4, 1e-3, 3e-3):
        for variant, reward in (
            ("grpo", "sim"),
            ("abpo", "logged"),
            ("grpo_cr", "logged"),
            ("abpo_ll", "logged"),
            ("wll", "logged"),
        ):
            cells.append(Cell(variant, reward, 1024, 1.0, lr))
    for lr in (1e-3, 3e-3):
        for variant, reward in (("grpo", "sim"), ("grpo_cr", "logged"), ("abpo_ll", "logged"), ("wll", "logged")):
            cells.append(Cell(variant, reward, 0, 1.0, lr))
    for epochs in (3.0,):
        for variant, reward in (("grpo", "sim"), ("abpo_ll", "logged"), ("wll", "logged")):
            cells.append(Cell(variant, reward, 0, epochs, 1e-3))
    # stage 4, added 2026-11-29 02:10 UTC after stage 1 (validation cells only): wll, the one logged-reward update
    # that rose at 1e-3 (every GRPO-surrogate update fell there), at a larger learning rate and more epochs
    cells += [Cell("wll", "logged", 0, 3.0, 3e-3), Cell("wll", "logged", 0, 1.0, 1e-2)]
    # stage 5, added 02:12 UTC after wll fell at 3e-3 on 1,024 rows (-0.65 pp): every row at 3e-4, 1 and 3 epochs;
    # and the demo's own arms as they are configured today (grpo 1,024 rows, grpo_cr 4,096 rows, lr 1e-4)
    cells += [Cell("wll", "logged", 0, 1.0, 3e-4), Cell("wll", "logged", 0, 3.0, 3e-4)]
    cells += [Cell("grpo", "logged", 1024, 1.0, 1e-4), Cell("grpo_cr", "logged", 4096, 1.0, 1e-4)]
    # stage 6, added 2026-11-29 15:35 UTC after the online bound still rose from 1 to 3 epochs on every row at tau 0.5
    # (+2.86 -> +3.50 pp) while wll stayed flat (+1.19 -> +1.22): 10 epochs of each, where the bound stops rising and
    # whether more passes over the same clicks move the logged update at all
    cells += [Cell("grpo", "sim", 0, 10.0, 1e-3), Cell("wll", "logged", 0, 10.0, 3e-4)]
    return cells


# the order the session ran the grid in (from 02:12 UTC, after stage 1): the cells most informative for the rule first
PRIORITY = (
    "wll-logged-r1024-e1-lr0.003",
    "wll-logged-rall-e1-lr0.001",
    "grpo-sim-rall-e1-lr0.001",
    "wll-logged-rall-e1-lr0.0003",
    "wll-logged-rall-e3-lr0.0003",
    "wll-logged-rall-e3-lr0.001",
    "grpo-sim-rall-e3-lr0.001",
    "grpo_cr-logged-r4096-e1-lr0.0001",
    "grpo-logged-r1024-e1-lr0.0001",
    "abpo_ll-logged-rall-e1-lr0.001",
    "grpo_cr-logged-rall-e1-lr0.001",
    "wll-logged-rall-e1-lr0.003",
    "wll-logged-rall-e3-lr0.003",
    "wll-logged-rall-e1-lr0.01",
)


# --smoke: headroom.py's throw-away tiny state (the arms bootstrapped on 12 users), with both strata in its month
SMOKE = [*HEADROOM_SMOKE, "sim.base_ctr=0.4"]
SMOKE_CELLS = [Cell("grpo", "sim", 64, 1.0, 1e-3), Cell("wll", "logged", 64, 1.0, 1e-3)]


def fingerprint(cell: Cell, args, cfg) -> str:
    key = {
        "cell": dataclasses.asdict(cell),
        "overrides": sorted(args.set),
        "config": cfg.name,
        "train": args.train_month,
        "score": args.score_month,
        "update_seed": args.update_seed,
        "taus": sorted(args.taus),
        "state": str(cfg.paths.resolve("root")),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def train_cell(cfg, cell: Cell, month: str, parent_dir: Path, strata, dataset, seed: int):
    """One update of ``cell`` from ``parent_dir`` on ``strata``; (the trained LLMArm, steps, wall s, CPU s)."""
    from abpo.arms.llm import LLMArm
    from abpo.train.runs import UpdateRun
    from abpo.train.update import run_update

    u = dataclasses.replace(
        cfg.update,
        resume=False,
        save_merged=True,
        max_examples=cell.rows,
        epochs=float(cell.epochs),
        learning_rate=float(cell.lr),
        lr_scheduler_type=cell.schedule,
    )
    c = dataclasses.replace(cfg, update=u, seed=seed)
    run = UpdateRun(
        variant=cell.variant,
        arm="budget",
        months=(month,),
        init_model=parent_dir,
        output=Path("budget_curve") / month / f"{cell.name}-seed{seed}",
    )
    t, cpu = time.perf_counter(), time.process_time()
    res = run_update(
        c,
        run,
        progress=False,
        strata=strata,
        log_mlflow=False,
        reward="simulated_click" if cell.reward == "sim" else "logged",
    )
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    policy = LLMArm.from_dir("budget", res.model_dir, cfg, dataset, f"{cell.name}/seed{seed}", variant=cell.variant)
    return policy, res.global_step, wall, cpu


def choose(cells: list[dict], tau: float, cpu_budget: float) -> dict | None:
    """The rule of the module docstring: the deployable (logged-reward) cell within the CPU budget with the largest
    gain over pi_init at ``tau``; ties within 0.05 points go to the cheaper one. None when no cell qualifies."""
    key = f"{tau:g}"
    ok = [c for c in cells if c["cell"]["reward"] == "logged" and c["cpu_s"] <= cpu_budget]
    if not ok:
        return None
    best = max(c["gain_pp"][key] for c in ok)
    near = [c for c in ok if c["gain_pp"][key] >= best - 0.05]
    return min(near, key=lambda c: (c["cpu_s"], c["name"]))


def curve_markdown(cells: list[dict], taus, pi_init: dict, oracle: float) -> str:
    head = " | ".join(f"Δ at τ {t:g} (pp)" for t in taus)
    lines = [
        "pi_init expected CTR: " + ", ".join(f"{100 * pi_init[format(t, 'g')]:.2f} % at τ {t:g}" for t in taus) + "; "
        f"oracle-greedy {100 * oracle:.2f} %",
        "",
        f"| cell | variant | reward | rows | epochs | lr | steps | CPU s | wall s | {head} |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(taus),
    ]
    for c in cells:
        k = c["cell"]
        gains = " | ".join(f"{c['gain_pp'][f'{t:g}']:+.2f}" for t in taus)
        lines.append(
            f"| {c['name']} | {k['variant']} | {k['reward']} | {'all' if k['rows'] == 0 else k['rows']} | "
            f"{k['epochs']:g} | {k['lr']:g} | {c['steps']} | {c['cpu_s']:.0f} | {c['wall_s']:.0f} | {gains} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--out", default="", help="folder of the finished cells (resumable) and the table")
    ap.add_argument("--train-month", default="2026-01", help="the month whose served rows every cell trains on")
    ap.add_argument("--score-month", default="2026-02", help="the month whose requests every cell is scored on")
    ap.add_argument(
        "--taus",
        default="",
        help="exposure temperatures to score at (default: the config's policy.tau, then 0.5 and 0.25)",
    )
    ap.add_argument(
        "--cells",
        default="",
        help="comma-separated cell names of the grid to run (default: every cell); 'priority': PRIORITY's, then the rest",
    )
    ap.add_argument("--update-seed", type=int, default=0, help="the updates' seed (row subsample, order, rollouts)")
    ap.add_argument("--cpu-budget", type=float, default=600.0, help="the rule's CPU seconds per update (default 600)")
    ap.add_argument("--list", action="store_true", help="print the grid's cells and exit")
    ap.add_argument("--choose", action="store_true", help="apply the rule to the finished cells (choice.json)")
    ap.add_argument("--smoke", action="store_true", help="two tiny cells in a throw-away state (seconds)")
    args = ap.parse_args(argv)

    cells = SMOKE_CELLS if args.smoke else grid()
    if args.list:
        for c in cells:
            print(c.name)
        return 0
    if args.cells == "priority":
        args.cells = ",".join([*PRIORITY, *(c.name for c in cells if c.name not in PRIORITY)])
    if args.cells:
        want = [s.strip() for s in args.cells.split(",") if s.strip()]
        names = {c.name: c for c in cells}
        unknown = [w for w in want if w not in names]
        if unknown:
            raise SystemExit(f"--cells: unknown {unknown}; rule: names that --list prints")
        cells = [names[w] for w in want]

    from headroom import month_start_version, pi_init_arm, served_month_strata

    from abpo.arms import versions
    from abpo.arms.names import arm_class
    from abpo.config import load_config
    from abpo.monthly.common import arms_of, dataset_and_splits
    from abpo.sim.headroom import candidate_click_probabilities, expected_ctr, oracle_greedy_ctr
    from abpo.sim.simulator import month_requests

    state = ""
    if args.smoke:
        state = tempfile.mkdtemp(prefix="abpo-bench-budget-")
        cfg = load_config(args.config, [*SMOKE, f"paths.root={state}", *args.set])
        from abpo.logs import quiet
        from abpo.monthly.bootstrap import bootstrap_arms

        with quiet():
            bootstrap_arms(cfg)
        args.score_month = args.train_month
    else:
        cfg = load_config(args.config, args.set)
    args.taus = [float(t) for t in args.taus.split(",")] if args.taus else [float(cfg.policy.tau), 0.5, 0.25]
    args.taus = list(dict.fromkeys(args.taus))
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="abpo-budget-curve-"))
    (out / "cells").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    ds, splits = dataset_and_splits(cfg)
    init = pi_init_arm(cfg, ds)
    parent_dir = versions.local_dir(cfg, init.name, "1")
    score_reqs = month_requests(cfg, ds, splits, args.score_month)
    probs, _ = candidate_click_probabilities(cfg, ds, score_reqs)
    served = [(r.user_id, r.history, r.candidates) for r in score_reqs]
    base = {f"{t:g}": expected_ctr(probs, e) for t, e in init.propensities_at(served, args.taus).items()}
    oracle = oracle_greedy_ctr(probs)
    print(
        f"budget curve of config {cfg.name} (seed {cfg.seed}, sim.salt {cfg.sim.salt}) in {cfg.paths.resolve('root')}: "
        f"train on {args.train_month}, score on {args.score_month} ({len(score_reqs)} requests); pi_init "
        + ", ".join(f"{100 * v:.2f} % at tau {k}" for k, v in base.items())
        + f"; oracle-greedy {100 * oracle:.2f} %",
        flush=True,
    )
    (out / "reference.json").write_text(json.dumps({"pi_init": base, "oracle": oracle, "taus": args.taus}, indent=1))

    strata = None
    done: list[dict] = []
    for cell in cells:
        fp = fingerprint(cell, args, cfg)
        path = out / "cells" / f"{cell.name}.json"
        if path.exists():
            rec = json.loads(path.read_text())
            if rec.get("fingerprint") == fp:
                done.append(rec)
                print(f"{cell.name}: reused ({path})", flush=True)
                continue
        if args.choose:
            continue
        if strata is None:  # the train month served by the month-start champions, once
            train_reqs = month_requests(cfg, ds, splits, args.train_month)
            train_probs, _ = candidate_click_probabilities(cfg, ds, train_reqs)
            champions = {}
            for a in arms_of(cfg):
                v, _ = month_start_version(cfg, a, args.train_month)
                champions[a] = arm_class(a).load(a, versions.local_dir(cfg, a, v), cfg, dataset=ds, model_version=v)
            strata = served_month_strata(
                cfg, args.train_month, champions, dataset=ds, splits=splits, requests=train_reqs, probs=train_probs
            )
            print(
                f"{args.train_month}: {strata[0].num_rows} clicks + {strata[1].num_rows} no-responses served",
                flush=True,
            )
        policy, steps, wall, cpu = train_cell(cfg, cell, args.train_month, parent_dir, strata, ds, args.update_seed)
        ts = time.perf_counter()
        ctr = {f"{t:g}": expected_ctr(probs, e) for t, e in policy.propensities_at(served, args.taus).items()}
        rec = {
            "name": cell.name,
            "cell": dataclasses.asdict(cell),
            "fingerprint": fp,
            "steps": steps,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "score_s": round(time.perf_counter() - ts, 1),
            "ctr": ctr,
            "gain_pp": {k: 100 * (ctr[k] - base[k]) for k in ctr},
            "train_month": args.train_month,
            "score_month": args.score_month,
            "update_seed": args.update_seed,
            "overrides": list(args.set),
        }
        path.write_text(json.dumps(rec, indent=1))
        done.append(rec)
        print(
            f"{cell.name}: {steps} steps, {cpu:.0f} CPU s ({wall:.0f} s wall); gain over pi_init "
            + ", ".join(f"{rec['gain_pp'][f'{t:g}']:+.2f} pp at tau {t:g}" for t in args.taus),
            flush=True,
        )
    md = curve_markdown(done, args.taus, base, oracle)
    (out / "curve.md").write_text(md + "\n")
    print("\n" + md)
    if args.choose:
        pick = choose(done, args.taus[0], args.cpu_budget)
        (out / "choice.json").write_text(
            json.dumps({"rule": "benchmarks/budget_curve.py:choose", "choice": pick}, indent=1)
        )
        print(f"\nchoice at tau {args.taus[0]:g}: {pick['name'] if pick else 'none qualifies'}")
    if args.smoke:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    bound = [c["gain_pp"][f"{args.taus[0]:g}"] for c in done if c["cell"]["reward"] == "sim"]
    logged = [c["gain_pp"][f"{args.taus[0]:g}"] for c in done if c["cell"]["reward"] == "logged"]
    print(f"wall time {time.perf_counter() - t0:.0f}s")
    print(
        f"Budget curve best online bound - pi_init: {max(bound) if bound else math.nan:+.2f} pp; best logged update - "
        f"pi_init: {max(logged) if logged else math.nan:+.2f} pp ({len(done)} cells)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
