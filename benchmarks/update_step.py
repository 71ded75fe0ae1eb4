"""Seconds per update step, side by side in one run: ABPO (variant F) against vanilla GRPO (variant B), and ABPO's
step with the item-token policy against the step before it (the text prompt), same model, data and G.

    .venv/bin/python benchmarks/update_step.py [--m 20 200] [--steps 4] [--reps 2] [--threads 1]
                                               [--variants abpo_ll,grpo_cr]

Rows timed, alternating within each repetition:
    B        vanilla GRPO with the preset (item-token prompt and scoring, one-forward constrained rollouts, full
             fine-tuning in the tiny preset)
    F        ABPO with the preset
    F-text   ABPO as before the item-token policy: policy.prompt_style=text, policy.max_history=10, LoRA r=8 on
             attention and MLP (policy.lora_r=8), constrained rollouts decoded token by token through HF generate,
             s_p (e0, e_old) the mean over the answer's tokens
    <variant>  with --variants, each named update variant (docs/update-variants.md) with the preset, its
             cost per step against B printed per M before the goal line (issue 49: "at what cost per step")
Goals: F/B <= 1.2 and F-text/F >= 3 at M = 20. With M = 20 among the sizes the last line is
`goal F/B <= 1.2 at M=20 (CPU time): <met|NOT met> (<F/B>); goal F-text/F >= 3: <met|NOT met> (<F-text/F>)`.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): M = 20, G = 3 (ABPO samples
G - 1 = 2 rollouts), 4 examples per step (half of the 8 requests logged as clicks: the update needs both strata), one
timed step, no warm-up, one repetition, a smaller tiny model (the figures mean nothing at that size); with
--processes the same sizes.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
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
        help="more rows beside B and F, comma-separated update variants (e.g. abpo_ll,grpo_cr: issue 49's cost per "
        "step against B); each is timed in the same alternation and its CPU ratio to B printed before the goal line",
    )
    ap.add_argument(
        "--processes",
        action="store_true",
        help="rows for 1 and 2 processes (P1, P2-DDP, P2-ZeRO2) instead of B / F / F-text",
    )
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)  # one process of a --processes row
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
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

    import torch
    from transformers import AutoModelForCausalLM

    from abpo.config import load_config
    from abpo.data.loaders import load_dataset
    from abpo.policy.model import build_tiny
    from abpo.train.dataset import update_dataset_from_strata
    from abpo.train.grpo_args import settings_for

    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="abpo-bench-") as tmp:
        tmp = Path(tmp)
        for m in args.m:
            cfg = load_config(
                args.config,
                [
                    *(SMOKE if args.smoke else []),
                    f"data.train_candidates={m}",
                    f"policy.max_prompt_tokens={max(1024, 24 * m + 512)}",
                ],
            )
            if args.group_size:
                cfg.update.group_size = args.group_size
            if args.batch_size:
                cfg.update.batch_size = args.batch_size
            dataset = load_dataset(cfg.data)
            model_dir = build_tiny(cfg.policy, cfg.paths, dataset.titles(), seed=cfg.seed)
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            n_req = cfg.update.batch_size * (args.steps + args.warmup) * 2
            text_cfg = dataclasses.replace(
                cfg,
                policy=dataclasses.replace(cfg.policy, prompt_style="text", max_history=10, lora_r=8),
            )
            import pyarrow as pa

            data = {}
            for style, c in (("item_tokens", cfg), ("text", text_cfg)):
                t0 = time.perf_counter()
                pos, neg = build_log(c, dataset, model, tok, n_req, args.click_rate, cfg.seed)
                ds, report = update_dataset_from_strata(
                    pa.Table.from_pylist(pos),
                    pa.Table.from_pylist(neg),
                    dataset.titles(),
                    tok,
                    c.policy,
                    examples_per_batch=cfg.update.batch_size,
                    seed=cfg.seed,
                )
                prompt_tokens = statistics.mean(
                    len(
                        tok.apply_chat_template(r, add_generation_prompt=True, tokenize=True, return_dict=True)[
                            "input_ids"
                        ]
                    )
                    for r in ds["prompt"][:8]
                )
                data[style] = (ds, prompt_tokens)
                print(
                    f"M={m} {style}: {len(pos)} clicks + {len(neg)} no-responses logged in "
                    f"{time.perf_counter() - t0:.1f}s; {len(ds)} rows, ~{prompt_tokens:.0f} prompt tokens, "
                    f"G={cfg.update.group_size}, batch={cfg.update.batch_size} examples",
                    flush=True,
                )
            runs = {  # name -> (variant, config, dataset)
                "B": ("grpo", cfg, data["item_tokens"][0]),
                "F": ("abpo", cfg, data["item_tokens"][0]),
                "F-text": ("abpo", text_cfg, data["text"][0]),
                **{v: (v, cfg, data["item_tokens"][0]) for v in variants},
            }
            prompt_tokens = (data["item_tokens"][1], data["text"][1])
            times = {k: [] for k in runs}
            cpu = {k: [] for k in runs}
            extra = []
            for rep in range(args.reps):
                for name, (variant, c, ds) in runs.items():
                    t, cp, x = time_variant(
                        variant,
                        model_dir,
                        tok,
                        ds,
                        c.update,
                        c.policy,
                        settings_for(c, variant, click_rate=args.click_rate),
                        args.steps,
                        args.warmup,
                        tmp / f"{m}-{rep}",
                        name,
                    )
                    times[name] += t
                    cpu[name] += cp
                    if name == "F":
                        extra += [v for v in x if v is not None]
                    print(
                        f"  rep {rep} {name:6s}: wall "
                        + " ".join(f"{v:.2f}" for v in t)
                        + " s/step; CPU "
                        + " ".join(f"{v:.2f}" for v in cp)
                        + " s/step",
                        flush=True,
                    )
            med = {k: statistics.median(v) for k, v in times.items()}
            medc = {k: statistics.median(v) for k, v in cpu.items()}
            results.append((m, med, medc, statistics.median(extra) if extra else float("nan"), prompt_tokens))

    print()
    print("median per optimizer step; wall = seconds, CPU = process CPU seconds (robust to other load)")
    print(
        f"{'M':>5} {'prompt tok (item/text)':>22} {'B CPU':>7} {'F CPU':>7} {'F-text CPU':>10} {'F/B':>6} "
        f"{'F-text/F':>9} {'F wall':>7} {'F-text wall':>11} {'F e_old+r_sc wall':>18}"
    )
    for m, med, medc, x, pt in results:
        print(
            f"{m:>5} {pt[0]:>10.0f}/{pt[1]:<11.0f} {medc['B']:>7.2f} {medc['F']:>7.2f} {medc['F-text']:>10.2f} "
            f"{medc['F'] / medc['B']:>6.2f} {medc['F-text'] / medc['F']:>9.2f} {med['F']:>7.2f} "
            f"{med['F-text']:>11.2f} {x:>18.2f}"
        )
    for m, _, medc, _, _ in results:
        if variants:  # issue 49 point 6: each variant's cost per step against B, the same alternation
            print(
                f"M={m} cost per step against B (CPU time): "
                + "; ".join(f"{v}/B {medc[v] / medc['B']:.2f}" for v in variants)
            )
    at20 = [(medc["F"] / medc["B"], medc["F-text"] / medc["F"]) for m, med, medc, _, _ in results if m == 20]
    if at20:
        fb, speed = at20[0]
        print(
            f"goal F/B <= 1.2 at M=20 (CPU time): {'met' if fb <= 1.2 else 'NOT met'} ({fb:.2f}); "
            f"goal F-text/F >= 3: {'met' if speed >= 3 else 'NOT met'} ({speed:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
