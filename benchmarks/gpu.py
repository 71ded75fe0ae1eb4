"""The monthly update on a GPU (bf16) against the CPU, side by side in one run: seconds per update step of ABPO
(variant F) and vanilla GRPO (variant B), the same with LoRA, pi_init's SFT, candidate scoring at M = 200, and peak
GPU memory, each through the command a user runs (`abpo sft`, `abpo update`).

    python benchmarks/gpu.py --state DIR --prepare                 # once, where the full install is (GX, DuckDB)
    python benchmarks/gpu.py --state DIR [--devices cuda cpu] [--sizes tiny small] [--steps 6] [--json FILE]
    python benchmarks/gpu.py --smoke --devices cpu                 # the same path in seconds (the test suite)

``scripts/gpu-check.sh`` runs it on the GPU machine (docs/gpu.md). ``--prepare`` builds the month the updates
train on, with the embedded defaults and the real pipeline: pi_init by `abpo sft` (the `tiny` preset, CPU, few
steps), one simulated month of its logged impressions by `abpo simulate-log`, landed and ingested by `abpo ingest`
(quarantine rules, Great Expectations) into the DuckDB warehouse. The month travels to the GPU machine (pi_init and
the MLflow store do not: each device's sft row trains and registers its own), where a worker per device copies it.

Rows, per device and model size (each device's rows in their own process; the CPU process does not see the GPU):
    sft            `abpo sft --max-steps S --no-eval`: stage 1 (one epoch of next-item pre-training) and S steps
                   of stage 2; seconds of each stage, registered in MLflow like any pi_init
    update F       `abpo update --variant abpo --max-steps N`: seconds per optimizer step (the trainer's step_time,
                   rollouts + e_old + advantages + loss + backward + AdamW), the median over steps 2..N
    update B       `abpo update --variant grpo`, the same rows, steps and seed
    update F LoRA  variant F with policy.lora_r=8 (adapters on attention and MLP, the backbone frozen)
    update F ZeRO-2  variant F with update.deepspeed=configs/deepspeed_zero2.json, one process launched by torchrun
                   (GPU rows only, where DeepSpeed imports; its peak memory is not read: another process; ZeRO-2 on
                   CPU processes: benchmarks/update_step.py --processes)
    score M=200    candidates scored per second by abpo.policy.scoring.score_examples (the gate's and the
                   simulator's scoring) over requests with M = 200 candidates
On CUDA the model runs in bf16 (policy.dtype=bfloat16, update.bf16=true: the `gpu` preset's precision); on the CPU
in float32 (the CPU presets'). Peak GPU memory is torch.cuda.max_memory_allocated over the row.

Sizes: ``tiny`` is the `tiny` preset's model (policy.tiny_*: hidden 64, 2 layers, ~1M parameters), ``small`` the
same Llama built from a larger config (hidden 512, 8 layers, 8 heads, ~35M parameters); nothing is downloaded.
The last line is `goal F/B <= 1.2 (<device>): <met|NOT met> (<F/B>)` for the first device (``--json`` also writes
every figure). ``--merge FILE`` adds another run's JSON (e.g. the 2-core development machine's CPU run) as columns.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MONTH = "2026-01"
# the state every row trains on: its users, its month's requests per user
PREPARE = ["data.max_users=100", "data.update_steps=4", "sft.pretrain_epochs=1", "sft.eval_max_users=20"]
SMOKE_PREPARE = ["data.max_users=24", "data.update_steps=4", "sft.pretrain_epochs=1", "sft.eval_max_users=5"]
SIZES = {
    "tiny": [],  # the preset's own shape
    "small": [
        "policy.tiny_hidden_size=512",
        "policy.tiny_layers=8",
        "policy.tiny_heads=8",
        "policy.tiny_intermediate_size=1408",
        "policy.tiny_vocab_size=8192",
    ],
    "smoke": [
        "policy.tiny_hidden_size=32",
        "policy.tiny_layers=1",
        "policy.tiny_heads=2",
        "policy.tiny_intermediate_size=64",
        "policy.tiny_vocab_size=2048",
        "update.max_completion_length=72",  # the catalog's longest answer + EOS in a 2,048-token vocabulary: 69
    ],
}
SMOKE_ARGS = {"sizes": ["smoke"], "steps": 2, "sft_steps": 2, "score_requests": 2}
ROWS = ("sft", "update F", "update B", "update F LoRA", "update F ZeRO-2", "score M=200")


def _sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


def _abpo(argv: list[str]) -> tuple[int, str]:
    """`abpo ARGV` in this process; returns its exit code and what it printed (also echoed)."""
    from abpo.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    out = buf.getvalue()
    sys.stdout.write(out)
    sys.stdout.flush()
    return rc, out


def prepare(state: Path, smoke: bool) -> None:
    """The month every row trains on (see the module's docstring), built once under ``state``."""
    done = state / "prepared.json"
    if done.exists():
        print(f"prepare: {state} is ready ({done})")
        return
    sets = [f"paths.root={state}", *(SMOKE_PREPARE if smoke else PREPARE), *SIZES["smoke" if smoke else "tiny"]]
    t0 = time.time()
    for argv in (
        ["sft", "--max-steps", "20", "--no-eval", "--no-mlflow"],
        ["simulate-log", "--month", MONTH],
        ["ingest", "--month", MONTH],
    ):
        rc, _ = _abpo([*argv, *_sets(sets)])
        if rc != 0:
            raise SystemExit(f"prepare: `abpo {' '.join(argv)}` exited {rc}")
    # what travels is the month (landing, warehouse, its validation result): pi_init and the MLflow store are made
    # again by each device's own sft row, so they are not carried (the GPU machine takes 64 MiB a call)
    for sub in ("models", "mlartifacts", "validation/data_docs", "duckdb_tmp"):
        shutil.rmtree(state / sub, ignore_errors=True)
    for f in state.glob("mlflow.db*"):
        f.unlink()
    done.write_text(json.dumps({"overrides": sets, "month": MONTH, "seconds": round(time.time() - t0, 1)}, indent=1))
    print(f"prepare: {state} ready in {time.time() - t0:.0f}s")


def _mlflow_step_times(tracking_uri: str, run_id: str) -> list[float]:
    from mlflow import MlflowClient

    hist = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, "step_time")
    return [m.value for m in sorted(hist, key=lambda m: m.step)]


def run_rows(args, device: str) -> dict:
    """Every row on ``device`` for every size (called in the worker process of that device), in a copy of the
    prepared state under a new folder of ``--work``; a folder in the temp dir (no ``--work``) is removed after."""
    work = Path(tempfile.mkdtemp(prefix=f"abpo-gpu-{device}-", dir=args.work))
    try:
        return _rows_in(args, device, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def _rows_in(args, device: str, work: Path) -> dict:
    import torch

    from abpo.config import load_config

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu.py: --devices cuda but torch.cuda.is_available() is False")
    prepared = json.loads((args.state / "prepared.json").read_text())
    state = work / "state"
    shutil.copytree(args.state, state)
    base = [o for o in prepared["overrides"] if not o.startswith(("paths.root=", "policy.tiny_"))]
    base += [f"paths.root={state}", "update.save_steps=1000000", "update.warmup_ratio=0.0", "update.max_examples=0"]
    if (state / "mlflow.db").exists():  # a state that carries its MLflow store: its paths made valid here
        rc, _ = _abpo(["state", "relocate", *_sets(base)])
        if rc != 0:
            raise SystemExit(f"gpu.py: `abpo state relocate` exited {rc}")
    prec = ["policy.dtype=bfloat16", "update.bf16=true"] if cuda else ["policy.dtype=float32", "update.bf16=false"]
    threads = args.cpu_threads or (os.cpu_count() or 1)
    out: dict = {"device": device, "name": torch.cuda.get_device_name(0) if cuda else _cpu_name(), "sizes": {}}
    out["threads"] = None if cuda else threads
    for size in args.sizes:
        shape = SIZES[size]
        # the tiny preset runs on one thread (policy.num_threads=1, many small ops); a larger model uses the cores
        thr = [] if cuda or size != "small" else [f"policy.num_threads={threads}"]
        sets = [*base, *shape, *prec, *thr]
        cfg = load_config("tiny", sets)
        rows: dict[str, dict] = {}
        uri = cfg.paths.tracking_uri()

        def start():
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            return time.perf_counter()

        def peak() -> float | None:
            return round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None

        # (a) pi_init of this size, on this device
        init = f"pi_init-{size}"
        t0 = start()
        rc, text = _abpo(
            ["sft", "--max-steps", str(args.sft_steps), "--no-eval", *_sets([*sets, f"sft.output={init}"])]
        )
        wall = time.perf_counter() - t0
        stages = _stage_seconds(text)
        rows["sft"] = {
            "rc": rc,
            "seconds": round(wall, 2),
            "stages": stages,
            "steps": args.sft_steps,
            "peak_mib": peak(),
        }
        init_dir = cfg.paths.resolve("models") / init
        # (b)-(d) the updates from that pi_init on the prepared month
        updates = [
            ("update F", "abpo", []),
            ("update B", "grpo", []),
            ("update F LoRA", "abpo", ["policy.lora_r=8", "policy.lora_alpha=16"]),
        ]
        if cuda and _imports("deepspeed"):
            updates.append(("update F ZeRO-2", "abpo", [f"update.deepspeed={ROOT / 'configs/deepspeed_zero2.json'}"]))
        for row, variant, extra in updates:
            argv = ["update", "--variant", variant, "--month", MONTH, "--init-model", str(init_dir)]
            argv += ["--output", f"upd-{size}-{row.replace(' ', '-')}", "--max-steps", str(args.steps), "--no-resume"]
            argv += _sets([*sets, *extra])
            t0 = start()
            if "ZeRO-2" in row:  # DeepSpeed initialises its process group: one process launched as docs/distributed.md
                rc, text = _launched(argv)
            else:
                rc, text = _abpo(argv)
            wall = time.perf_counter() - t0
            # the launched row's memory is another process's: not read (None), rather than this process's
            rec: dict = {"rc": rc, "wall_seconds": round(wall, 2), "peak_mib": None if "ZeRO-2" in row else peak()}
            if rc == 0 and "MLflow run " in text:
                times = _mlflow_step_times(uri, text.split("MLflow run ")[1].split()[0])
                rec["step_times"] = [round(t, 4) for t in times]
                rec["s_per_step"] = round(statistics.median(times[1:] or times), 4)
            rows[row] = rec
        # (e) candidate scoring at M = 200 with pi_init of this size
        rows["score M=200"] = _score_row(cfg, init_dir, device, args.score_requests, start, peak)
        params = _n_params(init_dir)
        out["sizes"][size] = {"params_m": params, "rows": rows}
        print(f"gpu.py: {device} {size} done: {json.dumps(rows)}", flush=True)
    return out


def _launched(argv: list[str]) -> tuple[int, str]:
    """`torchrun --standalone --nproc_per_node 1 -m abpo.cli ARGV` (its own process: DeepSpeed's process group and
    accelerate's state are per process); returns its exit code and output (also echoed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "abpo.cli"]
    proc = subprocess.run([*cmd, *argv], capture_output=True, text=True)
    sys.stdout.write(proc.stdout + proc.stderr[-4000:])
    sys.stdout.flush()
    return proc.returncode, proc.stdout


def _stage_seconds(text: str) -> dict[str, float]:
    """Stage 1 and 2 seconds as `abpo sft` logs them ('pi_init stage 1 (...): 1.9s')."""
    import re

    got = {}
    for stage, key in (("1", "pretrain"), ("2", "sft")):
        m = re.search(rf"pi_init stage {stage} [^:]*: ([\d.]+)s", text)
        if m:
            got[key] = float(m.group(1))
    return got


def _score_row(cfg, model_dir: Path, device: str, n_requests: int, start, peak) -> dict:
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.data.candidates import build_bandit_requests
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.policy.scoring import score_examples

    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    reqs = build_bandit_requests(splits, ds, dataclasses.replace(cfg.data, train_candidates=200))[:n_requests]
    dtype = torch.bfloat16 if cfg.policy.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    titles = ds.titles()
    score_examples(model, tok, reqs[:1], titles, cfg.policy)  # warm-up (kernels, allocator)
    t0 = start()
    score_examples(model, tok, reqs, titles, cfg.policy)
    if device == "cuda":
        torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    n = sum(len(r.candidates) for r in reqs)
    return {"candidates": n, "seconds": round(sec, 4), "cand_per_s": round(n / sec, 1), "peak_mib": peak()}


def _n_params(model_dir: Path) -> float:
    from transformers import AutoModelForCausalLM

    return round(AutoModelForCausalLM.from_pretrained(model_dir).num_parameters() / 1e6, 2)


def _imports(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return f"CPU ({os.cpu_count()} cores)"


def _cell(rec: dict | None, row: str) -> str:
    if rec is None:
        return "-"
    if rec.get("rc", 0) != 0:
        return f"exit {rec['rc']}"
    if row == "sft":
        st = rec.get("stages", {})
        return f"{rec['seconds']:.1f} s ({st.get('pretrain', 0):.1f} + {st.get('sft', 0):.1f})"
    if row.startswith("score"):
        return f"{rec['cand_per_s']:,.0f} cand/s"
    return f"{rec['s_per_step']:.3f} s/step" if "s_per_step" in rec else "-"


def print_table(runs: list[dict]) -> None:
    """One table: a row per (size, row), a column pair (figure, peak MiB) per run, and the ratio of the first run
    against each other run."""
    print()
    for i, r in enumerate(runs):
        thr = f", {r['threads']} torch threads" if r.get("threads") else ""
        print(f"run {i + 1}: {r['device']} = {r['name']}{thr}" + (f" [{r['label']}]" if r.get("label") else ""))
    head = f"{'size':<6} {'row':<16}" + "".join(f" {'run ' + str(i + 1):>24} {'peak MiB':>9}" for i in range(len(runs)))
    head += "".join(f" {'run ' + str(j + 1) + '/run 1':>12}" for j in range(1, len(runs)))
    print(head)
    sizes = list(dict.fromkeys(s for r in runs for s in r["sizes"]))
    for size in sizes:
        for row in ROWS:
            recs = [r["sizes"].get(size, {}).get("rows", {}).get(row) for r in runs]
            if all(x is None for x in recs):
                continue
            line = f"{size:<6} {row:<16}"
            for rec in recs:
                pk = rec.get("peak_mib") if rec else None
                line += f" {_cell(rec, row):>24} {(f'{pk:,.0f}' if pk is not None else '-'):>9}"
            for rec in recs[1:]:
                line += f" {_ratio(recs[0], rec, row):>12}"
            print(line)
        fb = [_fb(r["sizes"].get(size, {}).get("rows", {})) for r in runs]
        print(f"{size:<6} {'F/B':<16}" + "".join(f" {(f'{x:.2f}' if x else '-'):>24} {'':>9}" for x in fb))


def _ratio(first: dict | None, other: dict | None, row: str) -> str:
    """How many times faster the first run is than the other on this row."""
    if not first or not other or first.get("rc", 0) or other.get("rc", 0):
        return "-"
    if row == "sft":
        return f"{other['seconds'] / first['seconds']:.1f}x"
    if row.startswith("score"):
        return f"{first['cand_per_s'] / other['cand_per_s']:.1f}x"
    if "s_per_step" in first and "s_per_step" in other:
        return f"{other['s_per_step'] / first['s_per_step']:.1f}x"
    return "-"


def _fb(rows: dict) -> float | None:
    f, b = rows.get("update F", {}), rows.get("update B", {})
    return f["s_per_step"] / b["s_per_step"] if "s_per_step" in f and "s_per_step" in b else None


def main(argv: list[str] | None = None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", type=Path, default=None, help="The prepared state (default: a temporary one).")
    ap.add_argument("--prepare", action="store_true", help="Only build the state (needs the full CPU install).")
    ap.add_argument("--devices", nargs="+", default=["cuda", "cpu"], choices=["cuda", "cpu"])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=6, help="Optimizer steps per update row (the first is warm-up).")
    ap.add_argument("--sft-steps", type=int, default=20, help="Stage-2 SFT steps of the sft row.")
    ap.add_argument("--score-requests", type=int, default=16, help="Requests scored in the score row.")
    ap.add_argument("--cpu-threads", type=int, default=0, help="torch threads of the small model on the CPU (0: all).")
    ap.add_argument("--json", type=Path, default=None, help="Write every figure here.")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="Other runs' --json files to add as columns.")
    ap.add_argument("--label", default="", help="A label of this run in the table (e.g. the machine).")
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="Where the workers' copies of the state go, kept (default: the temp dir, removed after).",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE_ARGS)
    if args.worker:  # one device's rows, in a process of their own
        res = run_rows(args, args.worker)
        Path(args.json).write_text(json.dumps(res, indent=1))
        return 0
    tmp = None  # the prepared state when no --state is given
    scratch = tempfile.mkdtemp(prefix="abpo-gpu-json-")  # the workers' json files
    try:
        if args.state is None:
            tmp = tempfile.mkdtemp(prefix="abpo-gpu-state-")
            args.state = Path(tmp) / "state"
        args.state = args.state.resolve()
        prepare(args.state, args.smoke)
        if args.prepare:
            return 0
        runs = []
        for device in args.devices:
            out = Path(scratch) / f"{device}.json"
            env = dict(os.environ)
            if device == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU rows never touch the GPU (abpo picks CUDA when it sees one)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", device, "--state", str(args.state)]
            cmd += ["--json", str(out), "--sizes", *args.sizes, "--steps", str(args.steps)]
            cmd += ["--sft-steps", str(args.sft_steps), "--score-requests", str(args.score_requests)]
            cmd += ["--cpu-threads", str(args.cpu_threads)] + (["--work", str(args.work)] if args.work else [])
            t0 = time.time()
            rc = subprocess.run(cmd, env=env).returncode
            if rc != 0:
                print(f"gpu.py: the {device} worker exited {rc}", file=sys.stderr)
                return rc
            res = json.loads(out.read_text())
            res["label"], res["seconds"] = args.label, round(time.time() - t0, 1)
            runs.append(res)
        for path in args.merge:
            got = json.loads(path.read_text())
            runs.extend(got if isinstance(got, list) else [got])
        if args.json:
            args.json.write_text(json.dumps(runs, indent=1))
        print_table(runs)
        fb = _fb(runs[0]["sizes"][args.sizes[-1]]["rows"])
        ok = fb is not None and fb <= 1.2
        print(
            f"goal F/B <= 1.2 ({runs[0]['device']}): {'met' if ok else 'NOT met'} ({fb if fb is not None else float('nan'):.2f})"
        )
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
