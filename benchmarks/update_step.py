"""Seconds per update step and logged rows per second, side by side in one run: ABPO (variant F) against vanilla GRPO
(variant B), ABPO's step with the item-token policy against the step before it (the text prompt), and each of B, F
and wll against the same rows trained by a baseline commit's code (the update made faster, as a ratio
against the code before), same model, data and G.

    .venv/bin/python benchmarks/update_step.py [--m 20 200] [--steps 4] [--reps 2] [--threads 1]
                                               [--variants abpo_ll,grpo_cr] [--baseline REV|none]

Rows timed, alternating within each repetition:
    B        vanilla GRPO with the preset (item-token prompt and scoring, one-forward constrained rollouts, full
             fine-tuning in the tiny preset)
    F        ABPO with the preset
    F-text   ABPO as before the item-token policy: policy.prompt_style=text, policy.max_history=10, LoRA r=8 on
             attention and MLP (policy.lora_r=8), constrained rollouts decoded token by token through HF generate,
             s_p (e0, e_old) the mean over the answer's tokens
    <variant>  with --variants, each named update variant (docs/update-variants.md) with the preset, its
             cost per step against B printed per M before the goal line ("at what cost per step")
    wll      with a baseline, the SNIPS-weighted likelihood of the clicked logged items (variant J) with the preset
Goals: F/B <= 1.2 and F-text/F >= 3 at M = 20. With M = 20 among the sizes the last line is
`goal F/B <= 1.2 at M=20 (CPU time): <met|NOT met> (<F/B>); goal F-text/F >= 3: <met|NOT met> (<F-text/F>)`, and
with a baseline the line before it is `logged rows/s now/baseline: <r>x (B), <r>x (F), <r>x (wll)` (at the first M).

Baseline (``--baseline REV``, default BASELINE below: main before the faster update step; ``none``: skip):
the tree of REV (git archive of abpo/, configs/, sql/) trains B, F and wll on the same dataset, model, preset file and
settings. Each checkout's rows run in a worker process of their own, started once (the imports, ~10 CPU-s, are not
timed), and the two workers alternate row by row (now B, baseline B, now F, baseline F, ...), so that load on a
shared machine falls on both alike. Logged rows per second = the logged examples of a step (update.batch_size) /
the median CPU seconds of a step; the ratio now/baseline of each row is printed.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): M = 20, G = 3 (ABPO samples
G - 1 = 2 rollouts), 4 examples per step (half of the 8 requests logged as clicks: the update needs both strata), one
timed step, no warm-up, one repetition, a smaller tiny model (the figures mean nothing at that size), the baseline
as given; with --processes the same sizes.

For each candidate-set size M: real D_bandit requests of the bundled MovieLens (abpo.data: splits, candidate
sets of size M), the `tiny` preset's model (policy.tiny_*; untrained weights: the cost of a step does not depend
on them), e0 = e_p(a|q) of that model over C under each row's own prompt style (abpo.policy.scoring.score_examples),
a logged action per request (a click with probability --click-rate, a_log = x_{t'+1}; otherwise a_log ~ e0 and
y = 1[a_log = x_{t'+1}]), stratified into batches of update.batch_size. Then each row trains `--steps` optimizer
steps (after --warmup untimed steps) from the same starting weights, alternating B, F, F-text ... `--reps` times; a
step's time is wall-clock from the Trainer's on_step_begin to on_step_end (rollout generation, rewards, advantages,
loss, backward, optimizer), and the process CPU time over the same span (what to compare on a shared machine, where
wall time swings with other load). F's extra work per step: e_old (scoring all M candidates of each logged example
under pi_old) and self-certainty. Prints the median seconds per step and the ratios.

GPU (vLLM vs HF generate tokens/second) is not measured here: this benchmark runs on the CPU preset.

    .venv/bin/python benchmarks/update_step.py --processes [--m 20] [--steps 4]

Rows for several processes instead (ABPO, variant F, the same data and the same update.batch_size, which counts the
examples of a step over all processes): P1 one process; P2-DDP two processes under torchrun (DDP over gloo);
P2-ZeRO2 two processes with update.deepspeed=configs/deepspeed_zero2.json (DeepSpeed's CPU accelerator; skipped
without the distributed extra). Each row is launched as its own `torchrun` (P1 too, so the three pay the same
start-up), rank 0 times its steps. On a machine with 2 cores this measures the overhead of the process group
(gradient all-reduce, gathered rewards, ZeRO's partitioned optimizer), not a speed-up: the processes share the cores
the single process had.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BASELINE = "07a7630"  # main before the faster update step (distinct prompts once, the choice-only loss)
COMPARED = ("B", "F", "wll")  # the rows a baseline also trains (the ratio line)

# --smoke: the same rows on a smaller tiny model and the fewest steps (overrides of the preset; the arguments below)
SMOKE = [
    "data.max_users=12",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
]
SMOKE_ARGS = {"m": [20], "steps": 1, "warmup": 0, "reps": 1, "group_size": 3, "batch_size": 4, "click_rate": 0.5}


def build_log(cfg, dataset, model, tok, n_requests: int, click_rate: float, seed: int):
    """Two IMPRESSIONS_SCHEMA-like strata (lists of dicts) of `n_requests` real bandit requests, e0 under the
    prompt style and s_p of `cfg.policy`."""
    import numpy as np

    from abpo.data.candidates import build_bandit_requests
    from abpo.data.splits import split_users
    from abpo.policy.scoring import candidate_propensities, sample_logged_action, score_examples

    splits, _ = split_users(dataset, cfg.data)
    requests = build_bandit_requests(splits, dataset, cfg.data)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(requests), size=min(n_requests, len(requests)), replace=False)
    chosen = [requests[i] for i in sorted(pick.tolist())]
    scored = score_examples(model, tok, chosen, dataset.titles(), cfg.policy)
    pos, neg = [], []
    for ex, sc in zip(chosen, scored):
        e = candidate_propensities(sc.scores, cfg.policy.tau)
        if rng.random() < click_rate:
            j = ex.candidates.index(ex.positive)
        else:
            j, _ = sample_logged_action(e.numpy(), rng)
        a = ex.candidates[j]
        row = {
            "impression_id": ex.request_id,
            "user_id": ex.user_id,
            "arm": "abpo",
            "history": list(ex.history),
            "candidates": list(ex.candidates),
            "item_id": a,
            "propensity": float(e[j]),
            "clicked": int(a == ex.positive),
            "logging_policy": f"softmax(tau={cfg.policy.tau})",
        }
        (pos if row["clicked"] else neg).append(row)
    return pos, neg


class StepTimer:
    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer.t0, timer.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer.t0)
                timer.cpu.append(time.process_time() - timer.c0)

        self.times: list[float] = []
        self.cpu: list[float] = []  # process CPU seconds (all threads): robust to other load on a shared machine
        self.callback = _CB()


def time_variant(variant, model_dir, tok, ds, update_cfg, policy_cfg, settings, steps, warmup, out_dir, name):
    import torch
    from transformers import AutoModelForCausalLM

    from abpo.policy.model import lora_config
    from abpo.train.update import train_update

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    u = dataclasses.replace(update_cfg, max_steps=steps + warmup, save_steps=10**6, warmup_ratio=0.0)
    s = dataclasses.replace(settings, variant=variant)
    timer = StepTimer()
    trainer, _ = train_update(
        model,
        tok,
        ds,
        u,
        s,
        output_dir=out_dir / name,
        seed=0,
        peft_config=lora_config(policy_cfg),
        resume=False,
        callbacks=[timer.callback],
        grpo_overrides={"save_strategy": "no"},
        quiet=True,
    )
    extra = [h.get("abpo/advantage_time_s") for h in trainer.state.log_history if "abpo/advantage_time_s" in h]
    return timer.times[warmup:], timer.cpu[warmup:], extra[warmup:]  # drop the warm-up steps


def worker(spec_path: str) -> int:
    """One process of a --processes row (launched by torchrun): train `steps + warmup` steps of variant F on the
    saved dataset; rank 0 writes its step times to the spec's `out` file."""
    import json

    import datasets
    import torch
    from transformers import AutoTokenizer

    from abpo.config import load_config
    from abpo.train.distributed import dist_state
    from abpo.train.grpo_args import settings_for

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    cfg = load_config(spec["config"], spec["sets"])
    dist = dist_state(deepspeed=bool(cfg.update.deepspeed))
    ds = datasets.load_from_disk(spec["dataset"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    t, cp, _ = time_variant(
        "abpo",
        spec["model_dir"],
        tok,
        ds,
        cfg.update,
        cfg.policy,
        settings_for(cfg, "abpo"),
        spec["steps"],
        spec["warmup"],
        Path(spec["work"]),
        spec["name"],
    )
    if dist.is_main:
        Path(spec["out"]).write_text(json.dumps({"wall": t, "cpu": cp}))
    return 0


def processes_rows(args) -> int:
    """The --processes rows (see the module docstring): P1, P2-DDP, P2-ZeRO2 as torchrun launches of `worker`."""
    import importlib.util
    import json
    import os
    import subprocess

    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.config import load_config
    from abpo.data.loaders import load_dataset
    from abpo.policy.model import build_tiny
    from abpo.train.dataset import update_dataset_from_strata

    m = args.m[0]
    sets = [
        *(SMOKE if args.smoke else []),
        f"data.train_candidates={m}",
        f"policy.max_prompt_tokens={max(1024, 24 * m + 512)}",
    ]
    if args.batch_size:
        sets.append(f"update.batch_size={args.batch_size}")
    if args.group_size:
        sets.append(f"update.group_size={args.group_size}")
    cfg = load_config(args.config, sets)
    rows = {"P1": (1, []), "P2-DDP": (2, [])}
    if importlib.util.find_spec("deepspeed") is not None:
        rows["P2-ZeRO2"] = (2, ["update.deepspeed=configs/deepspeed_zero2.json"])
    else:
        print("P2-ZeRO2 skipped: deepspeed is not installed (pip install 'abpo[distributed]')")
    results = {}
    with tempfile.TemporaryDirectory(prefix="abpo-bench-") as tmp:
        tmp = Path(tmp)
        dataset = load_dataset(cfg.data)
        model_dir = build_tiny(cfg.policy, cfg.paths, dataset.titles(), seed=cfg.seed)
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        n_req = cfg.update.batch_size * (args.steps + args.warmup) * 2
        pos, neg = build_log(cfg, dataset, model, tok, n_req, args.click_rate, cfg.seed)
        ds, _ = update_dataset_from_strata(
            pa.Table.from_pylist(pos),
            pa.Table.from_pylist(neg),
            dataset.titles(),
            tok,
            cfg.policy,
            examples_per_batch=cfg.update.batch_size,
            seed=cfg.seed,
        )
        ds.save_to_disk(str(tmp / "dataset"))
        print(
            f"M={m}: {len(ds)} rows, G={cfg.update.group_size}, batch={cfg.update.batch_size} examples per step "
            f"over all processes",
            flush=True,
        )
        for rep in range(args.reps):
            for name, (n, extra) in rows.items():
                out = tmp / f"{name}-{rep}.json"
                spec = {
                    "config": args.config,
                    "sets": [*sets, *extra],
                    "dataset": str(tmp / "dataset"),
                    "model_dir": str(model_dir),
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "threads": args.threads,
                    "work": str(tmp / f"work-{rep}"),
                    "name": name,
                    "out": str(out),
                }
                (tmp / "spec.json").write_text(json.dumps(spec))
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc_per_node={n}",
                    __file__,
                    "--worker",
                    str(tmp / "spec.json"),
                ]
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                p = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if p.returncode != 0:
                    print((p.stdout + p.stderr)[-3000:])
                    raise SystemExit(f"{name}: {' '.join(cmd)} exited {p.returncode}")
                r = json.loads(out.read_text())
                results.setdefault(name, {"wall": [], "cpu": []})
                results[name]["wall"] += r["wall"]
                results[name]["cpu"] += r["cpu"]
                print(
                    f"  rep {rep} {name:8s}: wall " + " ".join(f"{v:.2f}" for v in r["wall"]) + " s/step; rank-0 "
                    "CPU " + " ".join(f"{v:.2f}" for v in r["cpu"]) + " s/step",
                    flush=True,
                )
    print()
    print(
        "median per optimizer step (the same examples per step in every row); wall = seconds, CPU = rank 0's "
        "process CPU seconds"
    )
    print(f"{'row':>9} {'procs':>5} {'wall':>7} {'CPU':>7} {'wall / P1':>9}")
    base = statistics.median(results["P1"]["wall"])
    for name, (n, _) in rows.items():
        w = statistics.median(results[name]["wall"])
        print(f"{name:>9} {n:>5} {w:>7.2f} {statistics.median(results[name]['cpu']):>7.2f} {w / base:>9.2f}")
    print(
        f"on {os.cpu_count()} cores: the processes share them, so the ratio is the overhead of the process group, "
        "not a speed-up"
    )
    return 0


def row_worker(code_root: str) -> int:
    """One checkout's rows: ``abpo`` imported from ``code_root``; reads a JSON row spec per line on stdin, trains that
    row (:func:`time_variant`, the checkout's own settings of its variant and config), writes its step times to the
    spec's ``out`` file and answers ``row-done`` on stdout."""
    import json

    sys.path.insert(0, code_root)  # before any import of abpo: this checkout's code
    import abpo

    if Path(abpo.__file__).resolve().parents[1] != Path(code_root).resolve():
        raise SystemExit(f"update_step.py worker: abpo imported from {abpo.__file__}, not from {code_root}")
    import datasets
    import torch
    from transformers import AutoTokenizer

    from abpo.config import load_config
    from abpo.train.grpo_args import settings_for

    for line in sys.stdin:
        spec = json.loads(line)
        torch.set_num_threads(spec["threads"])
        cfg = load_config(spec["config"], spec["sets"])
        tok = AutoTokenizer.from_pretrained(spec["model_dir"])
        t, cp, x = time_variant(
            spec["variant"],
            spec["model_dir"],
            tok,
            datasets.load_from_disk(spec["dataset"]),
            cfg.update,
            cfg.policy,
            settings_for(cfg, spec["variant"], click_rate=spec["click_rate"]),
            spec["steps"],
            spec["warmup"],
            Path(spec["work"]),
            spec["name"],
        )
        Path(spec["out"]).write_text(json.dumps({"wall": t, "cpu": cp, "extra": [v for v in x if v is not None]}))
        print("row-done", flush=True)
    return 0


class RowWorker:
    """A :func:`row_worker` process of one checkout (``root``), its stderr in ``log``; :meth:`run` trains one row."""

    def __init__(self, root: Path, log: Path, threads: int):
        import os
        import subprocess

        self.log = log
        self._err = open(log, "w")  # noqa: SIM115 - closed by close()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(root)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--row-worker", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            cwd=str(log.parent),
            env=env,
        )

    def run(self, spec: dict) -> dict:
        import json

        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.strip() == "row-done":
                return json.loads(Path(spec["out"]).read_text())
        self.close()
        tail = self.log.read_text()[-3000:]
        raise SystemExit(f"update_step.py: the worker of row {spec['name']} exited {self.proc.returncode}:\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self._err.close()


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (git archive of abpo/, configs/ and sql/) under ``into``; SystemExit naming the revision
    when git cannot give it."""
    import subprocess

    into.mkdir(parents=True)
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "abpo", "configs", "sql"], capture_output=True, check=False
    )
    if tar.returncode != 0:
        raise SystemExit(f"update_step.py --baseline {rev}: git archive failed: {tar.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    return into


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[20, 200], help="candidate-set sizes M (default 20 200)")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per run")
    ap.add_argument("--reps", type=int, default=2, help="B/F alternations per M")
    ap.add_argument("--group-size", type=int, default=None, help="G (default: the tiny preset's update.group_size)")
    ap.add_argument("--batch-size", type=int, default=None, help="logged examples per step (default: the preset's)")
    ap.add_argument("--click-rate", type=float, default=0.25, help="share of requests logged as clicks")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the tiny preset's policy.num_threads is 1)")
    ap.add_argument("--config", default="tiny")
    ap.add_argument(
        "--variants",
        default="",
        help="more rows beside B and F, comma-separated update variants (e.g. abpo_ll,grpo_cr: the cost per "
        "step against B); each is timed in the same alternation and its CPU ratio to B printed before the goal line",
    )
    ap.add_argument(
        "--baseline",
        default=BASELINE,
        help=f"git revision whose code also trains B, F and wll, for the logged rows/s ratio now/baseline (default "
        f"{BASELINE}: main before the faster update step); none: skip",
    )
    ap.add_argument(
        "--processes",
        action="store_true",
        help="rows for 1 and 2 processes (P1, P2-DDP, P2-ZeRO2) instead of B / F / F-text",
    )
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)  # one process of a --processes row
    ap.add_argument("--row-worker", metavar="CODE_ROOT", help=argparse.SUPPRESS)  # one checkout's rows
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
    if args.row_worker:
        return row_worker(args.row_worker)  # first: abpo is imported from the worker's checkout
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    if args.smoke:
        vars(args).update(SMOKE_ARGS)
    if args.worker:
        return worker(args.worker)
    if args.processes:
        return processes_rows(args)
    from abpo.algo.variants import VARIANTS

    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS or v in ("none", "grpo", "abpo")]
    if unknown:
        ap.error(f"--variants: {unknown} are not update variants beside B and F ({', '.join(sorted(VARIANTS))})")
    baseline = None if args.baseline.lower() == "none" else args.baseline
    with tempfile.TemporaryDirectory(prefix="abpo-bench-") as tmp:
        tmp = Path(tmp)
        roots = {"now": REPO, **({f"baseline {baseline}": checkout(baseline, tmp / "baseline")} if baseline else {})}
        workers = {
            side: RowWorker(root, tmp / f"worker-{i}.log", args.threads) for i, (side, root) in enumerate(roots.items())
        }
        try:
            results = [measure_m(args, m, variants, workers, tmp) for m in args.m]
        finally:
            for w in workers.values():
                w.close()
    report(results, variants, baseline)
    return 0


def measure_m(args, m: int, variants: list[str], workers: dict, tmp: Path):
    """The rows of one candidate-set size M: the logs and datasets (this checkout's code), then every row trained by
    the workers, alternated; returns (M, median wall and CPU s/step per row, F's e_old + r_sc wall, prompt tokens,
    the baseline's median CPU s/step per compared row, logged rows per step)."""
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.config import load_config, preset_path
    from abpo.data.loaders import load_dataset
    from abpo.policy.model import build_tiny
    from abpo.train.dataset import update_dataset_from_strata

    torch.set_num_threads(args.threads)
    sets = [
        *(SMOKE if args.smoke else []),
        f"data.train_candidates={m}",
        f"policy.max_prompt_tokens={max(1024, 24 * m + 512)}",
        *([f"update.group_size={args.group_size}"] if args.group_size else []),
        *([f"update.batch_size={args.batch_size}"] if args.batch_size else []),
    ]
    text_sets = [*sets, "policy.prompt_style=text", "policy.max_history=10", "policy.lora_r=8"]
    config = str(preset_path(args.config).resolve())  # the same preset file for both checkouts
    cfg, text_cfg = load_config(config, sets), load_config(config, text_sets)
    dataset = load_dataset(cfg.data)
    model_dir = build_tiny(cfg.policy, cfg.paths, dataset.titles(), seed=cfg.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n_req = cfg.update.batch_size * (args.steps + args.warmup) * 2
    data = {}
    for style, c in (("item_tokens", cfg), ("text", text_cfg)):
        t0 = time.perf_counter()
        pos, neg = build_log(c, dataset, model, tok, n_req, args.click_rate, cfg.seed)
        ds, _ = update_dataset_from_strata(
            pa.Table.from_pylist(pos),
            pa.Table.from_pylist(neg),
            dataset.titles(),
            tok,
            c.policy,
            examples_per_batch=cfg.update.batch_size,
            seed=cfg.seed,
        )
        prompt_tokens = statistics.mean(
            len(tok.apply_chat_template(r, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
            for r in ds["prompt"][:8]
        )
        ds.save_to_disk(str(tmp / f"data-{m}-{style}"))
        data[style] = prompt_tokens
        print(
            f"M={m} {style}: {len(pos)} clicks + {len(neg)} no-responses logged in "
            f"{time.perf_counter() - t0:.1f}s; {len(ds)} rows, ~{prompt_tokens:.0f} prompt tokens, "
            f"G={cfg.update.group_size}, batch={cfg.update.batch_size} examples",
            flush=True,
        )
    compare = len(workers) > 1
    runs = {  # name -> (variant, config overrides, dataset)
        "B": ("grpo", sets, "item_tokens"),
        "F": ("abpo", sets, "item_tokens"),
        "F-text": ("abpo", text_sets, "text"),
        **{v: (v, sets, "item_tokens") for v in variants},
        **({"wll": ("wll", sets, "item_tokens")} if compare and "wll" not in variants else {}),
    }
    times = {(side, k): [] for side in workers for k in runs}
    cpu = {(side, k): [] for side in workers for k in runs}
    extra = []
    for rep in range(args.reps):
        for name, (variant, row_sets, style) in runs.items():
            for side, w in workers.items():
                if side != "now" and name not in COMPARED:
                    continue
                r = w.run(
                    {
                        "variant": variant,
                        "config": config,
                        "sets": row_sets,
                        "click_rate": args.click_rate,
                        "dataset": str(tmp / f"data-{m}-{style}"),
                        "model_dir": str(model_dir),
                        "steps": args.steps,
                        "warmup": args.warmup,
                        "threads": args.threads,
                        "work": str(tmp / f"{m}-{rep}-{side.split()[0]}"),
                        "name": name,
                        "out": str(tmp / "row.json"),
                    }
                )
                times[side, name] += r["wall"]
                cpu[side, name] += r["cpu"]
                if name == "F" and side == "now":
                    extra += r["extra"]
                label = f"{name:6s} {side}" if compare else f"{name:6s}"
                print(
                    f"  rep {rep} {label}: wall "
                    + " ".join(f"{v:.2f}" for v in r["wall"])
                    + " s/step; CPU "
                    + " ".join(f"{v:.2f}" for v in r["cpu"])
                    + " s/step",
                    flush=True,
                )
    med = {k: statistics.median(times["now", k]) for k in runs}
    medc = {k: statistics.median(cpu["now", k]) for k in runs}
    base = {k: statistics.median(cpu[side, k]) for side in workers if side != "now" for k in COMPARED}
    x = statistics.median(extra) if extra else float("nan")
    return m, med, medc, x, (data["item_tokens"], data["text"]), base, cfg.update.batch_size


def report(results, variants: list[str], baseline: str | None) -> None:
    """The summary table, the variants' cost line, the logged rows/s (and the ratio to the baseline) and the goal
    line, last."""
    print()
    print("median per optimizer step; wall = seconds, CPU = process CPU seconds (robust to other load)")
    print(
        f"{'M':>5} {'prompt tok (item/text)':>22} {'B CPU':>7} {'F CPU':>7} {'F-text CPU':>10} {'F/B':>6} "
        f"{'F-text/F':>9} {'F wall':>7} {'F-text wall':>11} {'F e_old+r_sc wall':>18}"
    )
    for m, med, medc, x, pt, _, _ in results:
        print(
            f"{m:>5} {pt[0]:>10.0f}/{pt[1]:<11.0f} {medc['B']:>7.2f} {medc['F']:>7.2f} {medc['F-text']:>10.2f} "
            f"{medc['F'] / medc['B']:>6.2f} {medc['F-text'] / medc['F']:>9.2f} {med['F']:>7.2f} "
            f"{med['F-text']:>11.2f} {x:>18.2f}"
        )
    for m, _, medc, _, _, _, _ in results:
        if variants:  # each variant's cost per step against B, the same alternation
            print(
                f"M={m} cost per step against B (CPU time): "
                + "; ".join(f"{v}/B {medc[v] / medc['B']:.2f}" for v in variants)
            )
    if baseline:  # logged rows per CPU second, this checkout against the baseline's code
        for m, _, medc, _, _, base, rows in results:
            now_rate = {k: rows / medc[k] for k in COMPARED}
            base_rate = {k: rows / base[k] for k in COMPARED}
            print(
                f"M={m} logged rows per CPU second ({rows} a step): now "
                + ", ".join(f"{k} {now_rate[k]:.1f}" for k in COMPARED)
                + f"; baseline {baseline} "
                + ", ".join(f"{k} {base_rate[k]:.1f}" for k in COMPARED)
            )
        _, _, medc, _, _, base, _ = results[0]
        print("logged rows/s now/baseline: " + ", ".join(f"{base[k] / medc[k]:.2f}x ({k})" for k in COMPARED))
    at20 = [(medc["F"] / medc["B"], medc["F-text"] / medc["F"]) for m, _, medc, _, _, _, _ in results if m == 20]
    if at20:
        fb, speed = at20[0]
        print(
            f"goal F/B <= 1.2 at M=20 (CPU time): {'met' if fb <= 1.2 else 'NOT met'} ({fb:.2f}); "
            f"goal F-text/F >= 3: {'met' if speed >= 3 else 'NOT met'} ({speed:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
