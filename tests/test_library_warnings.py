"""The demo's steps print no library warning (issue 59 point 13: `make demo` printed transformers' FutureWarning about
gradient_checkpointing, torch's pin_memory warning and implicit's OpenBLAS RuntimeWarning, once per process).

Fresh processes with ``-W default`` (each warning shown once per place, whatever filters the environment set) run
what the demo's steps run, on the tiny preset shrunk. The first loads and scores a saved ALS ranker, as a fresh serve
task does (implicit checks the BLAS threads when a model is built, fitted or loaded, once per process), then runs a
whole month (`abpo arms month --simulate`: pi_init's SFT, the rankers' fits, every registration, serve, ingest with
GX, an LLM arm's update, gate, promote, refit, report). The second runs the month's update again alone, as the
demo's update task does in its own process: a warning shown once per process may be swallowed in the first by a
library that records warnings before abpo's step meets it. OpenBLAS is given 2 threads, as on any multi-core machine,
so implicit's check has something to say unless abpo limits the threads where it asks.

A DeprecationWarning (SQLAlchemy's, under MLflow's store) is not counted: Python's default filters hide it from every
console outside ``__main__``; it is addressed to the library's own developers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.sizes import LIKELY_CLICKS, MONTH, TINY_MODEL, without

# the standard format of a shown warning: "<file>:<line>: <Category>: <message>"
SHOWN = re.compile(r"^(?P<where>\S+):(?P<line>\d+): (?P<category>[A-Za-z_]\w*): (?P<message>.*)$", re.M)

SETS = [
    *without(MONTH, "sft.max_steps", "data.max_users", "update.max_steps", "update.batch_size"),
    "data.max_users=40",
    "sft.max_steps=4",
    "update.max_steps=1",
    "update.batch_size=4",
    *LIKELY_CLICKS,
    *TINY_MODEL,
    "arms.names=abpo,ml_retrain,popularity",
    "report.arm_shares={abpo: 0.5, ml_retrain: 0.25, popularity: 0.25}",
    "arms.gate_max_users=20",
    "arms.gate_ope_bootstrap=50",
]

CHILD = """
import sys
import warnings

default_show = warnings.showwarning


def show(message, category, filename, lineno, file=None, line=None):
    hidden = issubclass(category, DeprecationWarning)  # what Python's default filters hide outside __main__
    print(f"ABPO-WARNING {{'hidden' if hidden else 'shown'}} {{category.__name__}} {{filename}}:{{lineno}}", file=sys.stderr)
    default_show(message, category, filename, lineno, file, line)


warnings.showwarning = show
if {ranker!r}:
    from abpo.baselines import load_ranker

    ranker = load_ranker({ranker!r})  # a fresh process's first ALS model, as the serve task's
    ranker.score([(0, [1, 2], [3, 4, 5])])

from abpo.cli import main

sys.exit(main({argv!r}))
"""


def _shown_warnings(env: dict[str, str], argv: list[str], ranker: str = "") -> list[str]:
    """The warnings a fresh ``python -W default`` process running ``abpo ARGV`` (after loading ``ranker``) shows,
    less the DeprecationWarnings Python hides by default; asserts that the command succeeded."""
    script = textwrap.dedent(CHILD.format(ranker=ranker, argv=argv))
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", script], env=env, capture_output=True, text=True, timeout=2400
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    marks = re.findall(r"^ABPO-WARNING (shown|hidden) (\S+) (\S+)$", proc.stderr, re.M)
    return [f"{category} at {where}" for kind, category, where in marks if kind == "shown"] + [
        m[0][:300] for m in SHOWN.finditer(proc.stderr) if not m["category"].endswith("DeprecationWarning")
    ]


@pytest.mark.slow
def test_the_demos_steps_print_no_library_warning(tmp_path):
    from abpo.baselines import make_ranker, save_ranker

    als = make_ranker("ml_retrain", seed=0, factors=4, iterations=2)
    als.fit({u: [1 + (u + i) % 7 for i in range(4)] for u in range(12)}, list(range(1, 9)))
    saved = save_ranker(als, tmp_path / "als")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABPO_", "MLFLOW_", "PYTHONWARNINGS"))}
    env.update({"ABPO_STATE": str(tmp_path / "var"), "OPENBLAS_NUM_THREADS": "2"})
    sets = [x for s in SETS for x in ("--set", s)]
    shown = _shown_warnings(env, ["arms", "month", "--month", "2026-01", "--simulate", *sets], str(saved))
    assert not shown, "\n".join(shown)
    assert (tmp_path / "var" / "cycle" / "2026-01.json").is_file()  # the month ran to its end
    shown = _shown_warnings(env, ["update", "--month", "2026-01", "--max-steps", "1", "--no-resume", *sets])
    assert not shown, "\n".join(shown)
