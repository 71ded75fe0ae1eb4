"""Do PyTorch's CPU kernels change what training produces? Trains a small Llama (shaped like the tiny policy) for
30 AdamW steps from a fixed seed in a fresh process per setting and prints a hash of the weights:

    default             the kernels PyTorch picks for this CPU (torch.backends.cpu.get_cpu_capability())
    default, again      the same setting rerun: the same machine is bit-for-bit reproducible
    1 thread            the same kernels with torch.set_num_threads(1)
    ATEN_CPU_CAPABILITY=avx2 / default
                        the kernels another CPU would pick (AVX2 only; no vector unit). Values this machine's CPU
                        does not support are skipped.

    .venv/bin/python benchmarks/cpu_kernels.py [--smoke]

A different hash under another capability is why a run on another machine gives the same conclusions within the
report's intervals, not the same digits. The last line is `distinct weight hashes: <n> of <settings>`.
``--smoke`` runs in seconds (tests/benchmarks/test_smoke.py): 2 steps on a batch of 4 x 8 tokens, under two settings
(default and ATEN_CPU_CAPABILITY=default: a fresh process each, as every setting).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

STEPS = 30
SMOKE_STEPS, SMOKE_BATCH = 2, (4, 8)  # --smoke: the same settings, 2 steps on 4 sequences of 8 tokens


def train_and_hash() -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("ABPO_BENCH_THREADS", "2")))
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    loss = torch.tensor(0.0)
    smoke = bool(os.environ.get("ABPO_BENCH_SMOKE"))
    for _ in range(SMOKE_STEPS if smoke else STEPS):
        batch = torch.randint(0, config.vocab_size, SMOKE_BATCH if smoke else (32, 50), generator=generator)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    return f"{torch.backends.cpu.get_cpu_capability():8s} loss {loss.item():.6f} weights {digest}"


SETTINGS = [
    ("default", {}),
    ("default, again", {}),
    ("1 thread", {"ABPO_BENCH_THREADS": "1"}),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}),
]


def main(argv: list[str] | None = None) -> None:
    import argparse

    from abpo.logs import progress_bars_only_on_a_terminal

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_STEPS} steps on a batch of "
        f"{SMOKE_BATCH[0]} x {SMOKE_BATCH[1]} tokens under two settings: seconds",
    )
    args = ap.parse_args(argv)

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    if os.environ.get("ABPO_BENCH_CHILD"):
        print(train_and_hash())
        return
    hashes = []
    print(f"{'setting':30s} {'kernels':8s} result")
    for name, extra in [SETTINGS[0], SETTINGS[-1]] if args.smoke else SETTINGS:
        env = {**os.environ, **extra, "ABPO_BENCH_CHILD": "1", **({"ABPO_BENCH_SMOKE": "1"} if args.smoke else {})}
        done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
        line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
        if not line:
            print(f"{name:30s} skipped (exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]})")
            continue
        print(f"{name:30s} {line}")
        hashes.append(line.rsplit(" ", 1)[-1])
    print(f"distinct weight hashes: {len(set(hashes))} of {len(hashes)}")


if __name__ == "__main__":
    main()
