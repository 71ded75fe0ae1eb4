"""Every script in benchmarks/ runs with --smoke (the same code path at the smallest sizes, in seconds) and ends with
the line its docstring and docs/benchmarks.md's table document, so a change elsewhere that breaks a benchmark
fails here instead of at the next measurement. A new script in benchmarks/ needs a case below."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUM = r"\d+(?:\.\d+)?"

# script -> (the last line, as a regex; the line before it, or None; extra arguments)
CASES = {
    "budget_curve.py": (
        r"Budget curve best online bound - pi_init: [+-]\d+\.\d\d pp; best logged update - pi_init: [+-]\d+\.\d\d pp "
        r"\(2 cells\)",
        r"wall time \d+s",
        [],
    ),
    "cpu_kernels.py": (r"distinct weight hashes: [12] of 2", None, []),
    "evaluate.py": (rf"users/s item_tokens/text = {NUM}x", None, []),
    "headroom.py": (
        r"Headroom oracle-greedy - pi_init: [+-]\d+\.\d\d pp; best champion - pi_init: [+-]\d+\.\d\d pp "
        r"\(mean over 1 month\(s\)\)",
        r"wall time \d+s",
        ["--online-bound", "abpo"],
    ),
    "gate_refusals.py": (
        r"Gate refusals: \d+ of \d+ challenger\(s\) ranked higher by expected CTR refused \(offline half \d+, "
        r"off-policy half \d+\); \d+ of \d+ ranked lower passed",
        r"wall time \d+s",
        ["--state", "{tmp}/state", "--json", "{tmp}/rows.json"],  # kept for CHECKS below
    ),
    "gate_power.py": (
        r"gate power: size (?:nan|[01]\.\d{3}) power at \+1pp (?:nan|[01]\.\d{3}) \(before: size (?:nan|[01]\.\d{3}) "
        r"power (?:nan|[01]\.\d{3})\)",
        None,
        ["--json", "{tmp}/power.json", "--in-sample", "1"],  # kept for CHECKS below
    ),
    "ingest.py": (
        rf"same quarantine counts and batch count; end to end now/baseline: {NUM}x \(ingest {NUM}x\)",
        None,
        [],
    ),
    "ope_coverage.py": (
        r"coverage of the true difference at nominal 95%: best \w+ [01]\.\d{3}; dr [01]\.\d{3}; snips [01]\.\d{3}",
        r"wall time \d+s",
        [],
    ),
    "policy_quality.py": (
        r"HR@5 pi_init=[01]\.\d{4} popularity=[01]\.\d{4} ml_retrain=[01]\.\d{4} sasrec=[01]\.\d{4}",
        r"pi_init - sasrec: HR@5 [+-]\d\.\d{4} \[[+-]\d\.\d{4}, [+-]\d\.\d{4}\] at M = 10, [+-]\d\.\d{4} "
        r"\[[+-]\d\.\d{4}, [+-]\d\.\d{4}\] on the full catalog",
        ["--state", "{tmp}/state"],
    ),
    "report.py": (
        rf"\(wall time on a machine with \d+ cores, load average now {NUM}, {NUM}, {NUM}\)",
        rf"ratio 20,000 / 10,000 rows \(x2 rows, x{NUM} aggregate rows\): report time x{NUM}, report CPU "
        rf"x{NUM}, aggregation time x{NUM}, raw-row SQL x{NUM}",
        [],
    ),
    "task_startup.py": (
        rf"task start-up cold/preload: wall {NUM}x, CPU {NUM}x \(2 starts each; preload paid once: {NUM} s\)",
        None,
        [],
    ),
    "scoring.py": (rf" +10 +\d+ +{NUM} +{NUM} +{NUM}x +\d\.\d\de[+-]\d\d", None, []),
    "simulate.py": (
        r"Kendall tau offline HR@5 vs simulated CTR: (?:-?[01]\.\d\d|nan)",
        r"Clear pairs under \w+: kept (\d+)/(\d+), reversed \d+",
        [],
    ),
    "simulate_throughput.py": (
        rf"steady state: popularity [\d,]+ impressions/s, tiny LLM [\d,]+ impressions/s \([\d,]+\.\dx\); "
        rf"set-up {NUM} s; month of [\d,]+ requests",
        None,
        [],
    ),
    "gpu.py": (
        r"gpu-check\.sh --cpu: tests/train/test_cuda_pinned\.py needs CUDA; not run",
        rf"goal F/B <= 1\.2 \(cpu\): (?:met|NOT met) \({NUM}\)",
        [],
    ),
    "which_update.py": (
        r"which_update: 2 experiment\(s\) done, selection \w+,\w+",
        r"wall time \d+s",
        ["--out", "{tmp}/which-update-out"],  # not the default, which-update-out/ in the checkout
    ),
    "update_step.py": (
        rf"goal F/B <= 1\.2 at M=20 \(CPU time\): (?:met|NOT met) \({NUM}\); "
        rf"goal F-text/F >= 3: (?:met|NOT met) \({NUM}\)",
        rf"logged rows/s now/baseline: {NUM}x \(B\), {NUM}x \(F\), {NUM}x \(wll\)",
        ["--variants", "abpo_ll,grpo_cr"],
    ),
}
# bootstrap every arm / prepare a month and train pi_init twice first: ~25-60 CPU-s
SLOW = {
    "simulate.py",
    "gpu.py",
    "headroom.py",
    "which_update.py",
    "budget_curve.py",
    "gate_refusals.py",
    "gate_power.py",
}
# scripts that a shell script runs as users run them: the smoke case runs that script (issue 44: `scripts/gpu-check.sh
# --cpu --smoke` runs in the suite)
RUNNERS = {"gpu.py": ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--cpu", "--smoke", "--out", "{tmp}/gpu-check"]}


def _check_gate_refusals(tmp_path: Path) -> None:
    from tests.benchmarks.test_gate_refusals import check_smoke_state

    check_smoke_state(tmp_path)


def _check_gate_power(tmp_path: Path) -> None:
    """OUT's shape (the issue's schema), each gate's size and power read from its own rows."""
    import json
    import math

    out = json.loads((tmp_path / "power.json").read_text())
    assert out["preset"] == "demo" and out["tau"] == 0.5 and set(out["fractions"]) == {"0.1", "0.25", "0.5"}
    for g in [out["gate"], out["before"], *out["fractions"].values()]:
        assert len(g["rows"]) == 7 and all(r["months"] == 3 for r in g["rows"])
        for r in g["rows"]:
            assert set(r) == {"delta_pp", "months", "pass_rate", "offline_pass_rate", "ope_pass_rate"}
            assert r["pass_rate"] <= min(r["offline_pass_rate"], r["ope_pass_rate"]) + 1e-12
        low = [r["pass_rate"] for r in g["rows"] if r["delta_pp"] <= -0.5]
        assert (math.isnan(g["size"]) and not low) or g["size"] == max(low)
    probe = out["in_sample"]
    assert probe["arm"] == "wll" and len(probe["replicates"]) == 1
    r = probe["replicates"][0]
    # the redesign's challenger trained without the held-out users' rows and is scored on exactly those
    assert r["gate"]["rows_trained"] + r["gate"]["rows_scored"] == r["before"]["rows_trained"]
    assert r["before"]["rows_scored"] == r["before"]["rows_trained"]
    # the whole gate on the trained challengers: a pass needs both halves' (or the guardrail's and the decision's)
    for design in ("gate", "before"):
        g = probe[design]
        assert g["rows"], f"no delta of the grid spanned for {design}"
        for row in g["rows"]:
            assert row["pass_rate"] <= min(row["offline_pass_rate"], row["ope_pass_rate"]) + 1e-12
            assert row["months"] == sum(c["delta_pp"] == row["delta_pp"] for c in probe["cells"][design])
        for c in probe["cells"][design]:
            assert 0 <= c["x"] <= 1 and 0 <= c["y"] <= 1 and c["x"] * c["y"] == 0


# script -> a check of what its smoke run left under tmp_path (its figures computed again independently)
CHECKS = {"gate_refusals.py": _check_gate_refusals, "gate_power.py": _check_gate_power}


def test_every_benchmark_has_a_smoke_case():
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts == sorted(CASES), "each script in benchmarks/ needs a --smoke case in tests/benchmarks/test_smoke.py"


@pytest.mark.parametrize("script", [pytest.param(s, marks=[pytest.mark.slow] if s in SLOW else []) for s in CASES])
def test_the_benchmark_runs_its_smoke_size(script, tmp_path):
    last, before, extra = CASES[script]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    temp = tmp_path / "temp"  # the script's temp dir: what it makes there it removes (gpu.py left 50 MB a run)
    temp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "ABPO_STATE": str(tmp_path / "abpo-state"),
        "PYTHON": sys.executable,
        "TMPDIR": str(temp),
    }
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *(a.format(tmp=tmp_path) for a in extra)]
    if script in RUNNERS:
        cmd = [a.format(tmp=tmp_path) for a in RUNNERS[script]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert lines and re.fullmatch(last, lines[-1]), f"{script} --smoke: last line {lines[-1:]} is not {last!r}"
    if before is not None:
        assert re.fullmatch(before, lines[-2]), (
            f"{script} --smoke: the line before the last, {lines[-2]!r}, is not {before!r}"
        )
    left = sorted(p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_"))  # torch's own cache
    assert left == [], f"{script} --smoke left these in its temp dir"
    if script in CHECKS:
        CHECKS[script](tmp_path)
