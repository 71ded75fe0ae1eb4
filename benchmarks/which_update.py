"""Which update moves the recommender up: the validation probes, the pre-registered choice
of variants, the diagnosis and the test tables, as one resumable command (docs/which-update.md).

    .venv/bin/python benchmarks/which_update.py [--out DIR] [--cores N] [--datasets ml,office]
                                                [--waves probes,mixed_sim,diagnosis,stale_sim,today] [--smoke]

Every experiment is an `abpo experiment` (finished cells are reused: rerunning resumes), in the state directory of
ABPO_STATE. The waves, in this order, each running its experiments side by side on --cores (default: all):

    probes      validation users, seed 0, the mixed (production) logger, 2 rounds, rows No-Update, B, F and every
                variant of docs/update-variants.md (G-L): `val-mixed_sim-<dataset>`
    (choice)    the pre-registered rule, fixed before any probe ran: score(v) = the mean over the datasets of
                HR@5(v) - HR@5(No-Update) after the last probe round; the KEEP = 2 best variants enter the test
                tables (ties: the order of CANDIDATES). Written once to <out>/selection.json and never recomputed
    mixed_sim, stale_sim, today
                the test tables: test users, seeds 0, 1, 2, rounds 3 (MovieLens) / 2 (Office_Products), rows
                No-Update, B, F and the two chosen variants; primary contrast: the first chosen - No-Update (HR@5,
                last round): `test-<regime>-<dataset>`
    diagnosis   validation users, seed 0, the mixed logger, 1 round, rows B and F trained on both strata, on the
                clicks only (update.no_response_weight = 0) and on the no-responses only (update.click_weight = 0),
                on the same logged rows: `diag-<both|clicks|noresp>-<dataset>`; and B and F with the KL term to
                pi_init (update.beta = 0.04, 2 rounds): `val-kl-<dataset>`

What each experiment wrote (table.md/csv, rounds.csv, experiment.json and its cells, each a few KB) is copied to
--out as soon as it finishes, with <out>/summary.md rebuilt after each wave, so that a run stopped early still leaves
every finished table. The last line is exactly `which_update: <k> experiment(s) done, selection <v1>,<v2>`.

``--smoke`` runs the same path in a few minutes (tests/benchmarks/test_smoke.py): MovieLens only, a smaller tiny
model on 60 users pre-trained for 2 epochs, one seed, one round, rows No-Update and two variants, the mixed regime's
test table only (the figures mean nothing at that size).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ("grpo_cr", "abpo_cr", "abpo_ll", "grpo_ll", "wll", "abpo_offpolicy")
BASE_ROWS = ("none", "grpo", "abpo")
KEEP = 2
DATASETS = {"ml": ("tiny", []), "office": ("amazon18", ["data.amazon_domain=Office_Products"])}
TEST_ROUNDS = {"ml": 3, "office": 2}
PROBE_ROUNDS = 2
REGIMES = ("mixed_sim", "stale_sim", "today")
WAVES = ("probes", "mixed_sim", "diagnosis", "stale_sim", "today")
SMOKE_SETS = [
    "data.max_users=60",
    "data.eval_candidates=20",
    "experiment.eval_candidates=0",
    "experiment.update_steps=0",
    "policy.tiny_hidden_size=32",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=600",
    "sft.max_steps=4",
    "sft.pretrain_epochs=2",  # pi_init's stage 1 at 2 epochs (preset: up to 20): the smoke's largest part
    "update.max_steps=1",
    "update.batch_size=4",
    "update.save_steps=100",
    "update.max_completion_length=128",
    "experiment.bootstrap_samples=200",
]
COPIED = ("table.md", "table.csv", "rounds.csv", "experiment.json")


class Job:
    """One `abpo experiment` of a wave."""

    def __init__(self, name: str, dataset: str, split: str, seeds: str, rounds: int, regime: str, rows, sets=()):
        self.name, self.dataset, self.split, self.seeds, self.rounds = name, dataset, split, seeds, rounds
        self.regime, self.rows, self.sets = regime, list(rows), list(sets)

    def chains(self) -> int:
        return len(self.rows) * len(self.seeds.split(","))

    def argv(self, workers: int, smoke: bool) -> list[str]:
        config, data_sets = DATASETS[self.dataset]
        sets = [*data_sets, *(SMOKE_SETS if smoke else []), *self.sets, f"experiment.name={self.name}"]
        return [
            sys.executable,
            "-c",
            "import sys; from abpo.cli import main; sys.exit(main(sys.argv[1:]))",
            "experiment",
            "--config",
            config,
            "--split",
            self.split,
            "--seeds",
            self.seeds,
            "--rounds",
            str(self.rounds),
            "--regime",
            self.regime,
            "--rows",
            ",".join(self.rows),
            "--workers",
            str(workers),
            *(a for s in sets for a in ("--set", s)),
        ]


def state_root() -> Path:
    return Path(os.environ.get("ABPO_STATE", ROOT / "var"))


def run_wave(jobs: list[Job], cores: int, out: Path, smoke: bool) -> list[str]:
    """Run the wave's experiments side by side, each with its share of the cores; copy each one's outputs to ``out``
    as it finishes. Returns the names done; a failed experiment is reported and its log kept, the others go on."""
    if not jobs:
        return []
    total = sum(j.chains() for j in jobs)

    def one(job: Job) -> str | None:
        workers = max(1, min(job.chains(), round(cores * job.chains() / total)))
        log = out / "logs" / f"{job.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        with open(log, "w") as fh:
            rc = subprocess.call(job.argv(workers, smoke), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        print(f"  {job.name}: rc {rc}, {time.time() - t0:.0f}s, {workers} worker(s)", flush=True)
        if rc != 0:
            return None
        src = state_root() / "experiments" / job.name
        dst = out / job.name
        (dst / "cells").mkdir(parents=True, exist_ok=True)
        for f in COPIED:
            if (src / f).exists():
                shutil.copy2(src / f, dst / f)
        for f in (src / "cells").glob("*.json"):
            shutil.copy2(f, dst / "cells" / f.name)
        return job.name

    with ThreadPoolExecutor(len(jobs)) as pool:
        return [n for n in pool.map(one, jobs) if n]


def table(out: Path, name: str) -> list[dict]:
    path = out / name / "table.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def select(out: Path, datasets: list[str], candidates: tuple[str, ...] = CANDIDATES) -> list[str]:
    """The pre-registered choice (module docstring): the KEEP variants with the largest mean over the datasets of
    HR@5(v) - HR@5(No-Update) after the last validation probe round. Written once; a later run reads it back."""
    path = out / "selection.json"
    if path.exists():
        return json.loads(path.read_text())["keep"]
    scores = {}
    for v in candidates:
        deltas = []
        for ds in datasets:
            rec = {r["row"]: r for r in table(out, f"val-mixed_sim-{ds}")}.get(v)
            if rec is None or rec.get("vs_none_dHR@5", "") == "":
                raise SystemExit(f"which_update: no validation probe of {v} on {ds} in {out}; run the probes wave")
            deltas.append(float(rec["vs_none_dHR@5"]))
        scores[v] = sum(deltas) / len(deltas)
    keep = sorted(candidates, key=lambda v: (-scores[v], candidates.index(v)))[:KEEP]
    path.write_text(
        json.dumps(
            {
                "rule": "mean over datasets of validation dHR@5 vs No-Update",
                "scores": scores,
                "keep": keep,
                "datasets": datasets,
                "at": time.strftime("%FT%TZ", time.gmtime()),
            },
            indent=1,
        )
    )
    return keep


def fmt(rec: dict, key: str, scale: float = 1.0) -> str:
    v = rec.get(key, "")
    return "" if v in ("", "nan", None) else f"{float(v) * scale:+.4f}"


def summary(out: Path) -> None:
    """<out>/summary.md: per experiment, each row's HR@5, its difference from No-Update with the two-stage interval
    and p, and from the last round of rounds.csv the off-policy CTR (SNIPS, own log) and the no-response rows'
    share of the summed |advantage|."""
    lines = ["# which_update summary", ""]
    for d in sorted(p for p in out.iterdir() if (p / "table.csv").exists()):
        exp = (
            json.loads((d / "experiment.json").read_text()).get("summary", {})
            if (d / "experiment.json").exists()
            else {}
        )
        lines += [
            f"## {d.name}",
            f"{exp.get('seeds', '?')} seed(s) x {exp.get('eval_users', '?')} {exp.get('eval_split', '')} users, "
            f"{exp.get('rounds', '?')} round(s), wall {exp.get('wall_seconds', '?')} s",
            "",
        ]
        last: dict[str, dict] = {}
        if (d / "rounds.csv").exists():
            for r in csv.DictReader(open(d / "rounds.csv")):
                last[r["row"]] = r  # rounds.csv is in round order: the last one stays
        lines += [
            "| row | HR@5 | - No-Update [95% CI] (p) | off-policy CTR (SNIPS, own log) | no-response |A| share |",
            "|---|---|---|---|---|",
        ]
        for rec in table(out, d.name):
            lo, hi = fmt(rec, "vs_none_ci_low_HR@5"), fmt(rec, "vs_none_ci_high_HR@5")
            diff = f"{fmt(rec, 'vs_none_dHR@5')} [{lo}, {hi}] ({rec.get('vs_none_p_HR@5', '')})" if lo else ""
            lr = last.get(rec["row"], {})
            lines.append(
                f"| {rec['label']} | {float(rec['HR@5']):.4f} | {diff} | {lr.get('ope_snips', '')} | "
                f"{lr.get('train_no_response_abs_share', '')} |"
            )
        lines.append("")
        lines += versus_f(d)
    (out / "summary.md").write_text("\n".join(lines))


def versus_f(d: Path) -> list[str]:
    """The issue's second primary contrast for a test table: each row other than A, B, F minus F (ABPO) on HR@5
    after the last round, with the two-stage interval over seeds then users (abpo.experiment.table.paired_tests on
    the cells copied beside the table), and each row's off-policy CTR on its own log: mean and SD over seeds."""
    from abpo.experiment.table import paired_tests

    by_row: dict[str, list[dict]] = {}
    for f in sorted((d / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        by_row.setdefault(cell["row"], []).append(cell)
    if "abpo" not in by_row or not d.name.startswith("test-"):
        return []
    last = max(int(c["round"]) for c in by_row["abpo"])
    final = {r: sorted((c for c in cs if int(c["round"]) == last), key=lambda c: c["seed"]) for r, cs in by_row.items()}
    lines = [
        f"{d.name}, after round {last}: row - F (ABPO) on HR@5, and the off-policy CTR (SNIPS, own log, mean ± SD over "
        "seeds)",
        "",
        "| row | - F HR@5 [95% CI] (p) | MDE | off-policy CTR |",
        "|---|---|---|---|",
    ]
    for row, cs in final.items():
        ope = [float(c["ope_snips"]) for c in cs if c.get("ope_snips") is not None]
        ope_s = f"{statistics.mean(ope):.4f} ± {statistics.stdev(ope) if len(ope) > 1 else 0.0:.4f}" if ope else ""
        vs = ""
        mde = ""
        if row not in ("none", "grpo", "abpo") and len(cs) == len(final["abpo"]):
            t = paired_tests(cs, final["abpo"])
            vs = f"{t['dHR@5']:+.4f} [{t['ci_low_HR@5']:+.4f}, {t['ci_high_HR@5']:+.4f}] ({t['p_HR@5']:.3f})"
            mde = f"{t['mde_HR@5']:.4f}"
        lines.append(f"| {row} | {vs} | {mde} | {ope_s} |")
    return [*lines, ""]


def smoke_base(smoke: bool) -> tuple[str, ...]:
    """The rows beside the variants: No-Update alone at the smoke size (seconds matter there), else BASE_ROWS."""
    return ("none",) if smoke else BASE_ROWS


def smoke_candidates(smoke: bool) -> tuple[str, ...]:
    """The variants the probes compare: two at the smoke size, else all of CANDIDATES."""
    return CANDIDATES[:KEEP] if smoke else CANDIDATES


def wave_jobs(wave: str, datasets: list[str], keep: list[str], *, smoke: bool) -> list[Job]:
    """The experiments of one wave (module docstring)."""
    probe_rounds = 1 if smoke else PROBE_ROUNDS
    if wave == "probes":
        rows = [*smoke_base(smoke), *smoke_candidates(smoke)]
        return [Job(f"val-mixed_sim-{ds}", ds, "validation", "0", probe_rounds, "mixed_sim", rows) for ds in datasets]
    if wave == "diagnosis":
        jobs = []
        for ds in datasets:
            for tag, sets in (
                ("both", []),
                ("clicks", ["update.no_response_weight=0"]),
                ("noresp", ["update.click_weight=0"]),
            ):
                jobs.append(Job(f"diag-{tag}-{ds}", ds, "validation", "0", 1, "mixed_sim", ["grpo", "abpo"], sets))
            kl = ["update.beta=0.04"]
            jobs.append(Job(f"val-kl-{ds}", ds, "validation", "0", probe_rounds, "mixed_sim", ["grpo", "abpo"], kl))
        return jobs
    if wave in REGIMES:
        seeds = "0" if smoke else "0,1,2"
        primary = [f"experiment.primary_contrast={keep[0]}-none"]
        return [
            Job(
                f"test-{wave}-{ds}",
                ds,
                "test",
                seeds,
                1 if smoke else TEST_ROUNDS[ds],
                wave,
                [*BASE_ROWS, *keep],
                primary,
            )
            for ds in datasets
        ]
    raise SystemExit(f"which_update: unknown wave {wave!r}; rule: one of {', '.join(WAVES)} (or several joined by +)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", default=str(ROOT / "which-update-out"), help="where results are copied (default: %(default)s)"
    )
    ap.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="worker processes in all (default: the cores)"
    )
    ap.add_argument("--datasets", default="ml,office", help="of ml (bundled MovieLens), office (Office_Products)")
    ap.add_argument(
        "--waves",
        default=",".join(WAVES),
        help=f"which waves, in this order (a+b: side by side): {','.join(WAVES)}",
    )
    ap.add_argument("--smoke", action="store_true", help="the same path at the smallest sizes (seconds per cell)")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    datasets = ["ml"] if a.smoke else [d for d in a.datasets.split(",") if d]
    waves = ["probes", "mixed_sim"] if a.smoke else [w for w in a.waves.split(",") if w]
    t0 = time.time()
    done: list[str] = []
    keep: list[str] = []
    for wave in waves:
        print(f"which_update: wave {wave} ({time.time() - t0:.0f}s)", flush=True)
        jobs: list[Job] = []
        for part in wave.split("+"):  # "a+b": both parts' experiments side by side
            if part in REGIMES:
                keep = keep or select(out, datasets, smoke_candidates(a.smoke))
            jobs += wave_jobs(part, datasets, keep, smoke=a.smoke)
        done += run_wave(jobs, a.cores, out, a.smoke)
        if "probes" in wave.split("+"):
            keep = select(out, datasets, smoke_candidates(a.smoke))
            print(f"which_update: selection {','.join(keep)}", flush=True)
        summary(out)
    print(f"wall time {time.time() - t0:.0f}s")
    keep = keep or (
        json.loads((out / "selection.json").read_text())["keep"] if (out / "selection.json").exists() else []
    )
    print(f"which_update: {len(done)} experiment(s) done, selection {','.join(keep)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
