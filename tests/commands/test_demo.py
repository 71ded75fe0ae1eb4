"""`abpo demo`'s console: one line per stage as it starts, with the time elapsed and an estimate of what remains
(abpo.commands.demo.Progress, from the stages' measured seconds scaled by this run's pace), the same on a terminal
and in a file; the libraries' chatter of a stage (transformers' logged steps, MLflow's INFO lines, Python's warnings)
goes to the stage's step log, not the console (abpo.logs.step_log), and with -v to both."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest

from abpo.commands.demo import (
    PRIOR_SECONDS,
    STAGE_SECONDS,
    Progress,
    StepLog,
    clock,
    demo_stages,
    estimate_remaining,
    left,
    progress_line,
)
from abpo.logs import step_log


@pytest.mark.parametrize(
    "seconds, want", [(0, "0:00"), (5.4, "0:05"), (59.6, "1:00"), (580, "9:40"), (3600, "1:00:00"), (3725, "1:02:05")]
)
def test_the_clock_reads_minutes_and_seconds(seconds, want):
    assert clock(seconds) == want


def test_a_progress_line_says_where_the_run_is():
    assert progress_line("month 2 of 4 (2026-02) through abpo_monthly", 580, 8 * 60 + 10) == (
        "month 2 of 4 (2026-02) through abpo_monthly ... 9:40 elapsed, about 8 min left"
    )
    assert (
        left(59) == "under a minute left" and left(90) == "about 2 min left" and left(14.2 * 60) == "about 14 min left"
    )


def test_the_estimate_starts_from_the_measured_run_and_follows_this_runs_pace():
    stages = [k for k, _ in demo_stages(["2026-01", "2026-02", "2026-03", "2026-04"])]
    assert stages == ["prepare", "bootstrap", "airflow_db", "month", "month", "month", "month", "final_report"]
    whole = sum(STAGE_SECONDS[k] for k in stages)
    assert 13 * 60 < whole < 15 * 60  # the measured run: the demo 14.1 and 14.4 min
    assert estimate_remaining(stages, []) == pytest.approx(whole)
    # a short first stage at half the pace moves the estimate little ...
    after_prepare = estimate_remaining(stages[1:], [("prepare", 2.0)])
    assert after_prepare == pytest.approx(whole - 4.0, rel=0.05)
    # ... a bootstrap twice as slow as measured nearly doubles what remains
    slow = [("prepare", 8.0), ("bootstrap", 2 * STAGE_SECONDS["bootstrap"])]
    pace = (8.0 + 2 * STAGE_SECONDS["bootstrap"] + PRIOR_SECONDS) / (4.0 + STAGE_SECONDS["bootstrap"] + PRIOR_SECONDS)
    assert estimate_remaining(stages[2:], slow) == pytest.approx(pace * sum(STAGE_SECONDS[k] for k in stages[2:]))
    assert 1.8 < pace < 2.0


def test_progress_gives_one_line_per_stage_in_order():
    months = ["2026-01", "2026-02"]
    p = Progress(demo_stages(months), t0=1000.0)
    first = p.start(now=1000.0)
    assert first.startswith("prepare the data ... 0:00 elapsed, about ")
    p.finish(4.0)
    p.start(now=1004.0)
    p.finish(330.3)
    p.start(now=1334.3)
    p.finish(3.0)
    line = p.start(now=1337.3)
    # the measured pace so far: what remains is the two months and the final report, at the measured seconds
    want = progress_line("month 1 of 2 (2026-01) through abpo_monthly", 337.3, 2 * 129.1 + 1.0)
    assert line == want == "month 1 of 2 (2026-01) through abpo_monthly ... 5:37 elapsed, about 4 min left"


def _chatter() -> str:
    """What a stage's libraries print: a Trainer's logged step (transformers' PrinterCallback prints the dict), an
    MLflow-style INFO line from a handler bound to the console's stderr when it was made (as transformers' and
    MLflow's are), a warning (Airflow's graphviz one), and abpo's own INFO and WARNING lines."""
    print({"loss": "7.312", "grad_norm": "3.1", "learning_rate": "0.0003", "mean_token_accuracy": "0"})
    lib = logging.getLogger("abpo_tests_lib.store.db.utils")
    lib.handlers = [logging.StreamHandler(sys.stderr)]
    lib.propagate = False
    lib.setLevel(logging.INFO)
    lib.info("Creating initial MLflow database tables...")
    warnings.warn(
        "Could not import graphviz. Rendering graph to the graphical format will not be possible.", stacklevel=1
    )
    logging.getLogger("abpo.tests.stage").info("pi_init: registered v1")
    logging.getLogger("abpo.tests.stage").warning("the gate's users are few")
    return "done"


def _warnings_shown_as_outside_pytest():
    """Python's own warning display (on the stderr of the moment), which pytest's warning capture replaces."""

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.simplefilter("always")
    warnings.showwarning = show


CHATTER = ("{'loss': '7.312'", "Creating initial MLflow database tables", "Could not import graphviz", "pi_init: reg")


@pytest.fixture
def console_logging(monkeypatch):
    """abpo's console handler as the CLI sets it up, restored after the test; a library logger removed after it."""
    from abpo.logs import PROGRESS_BAR_SWITCHES, console

    for k in PROGRESS_BAR_SWITCHES:  # step_log turns the progress bars off in the environment: restore it
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    logger = logging.getLogger("abpo")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    console()
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    logging.getLogger("abpo_tests_lib.store.db.utils").handlers = []


def test_a_stages_chatter_goes_to_its_step_log_not_the_console(tmp_path, capsys, console_logging):
    path = tmp_path / "logs" / "bootstrap.log"
    with warnings.catch_warnings():
        _warnings_shown_as_outside_pytest()
        with step_log(path):
            assert _chatter() == "done"
    seen = capsys.readouterr()
    console = seen.out + seen.err
    for line in CHATTER:
        assert line not in console, (line, console)
    assert console == "WARNING: the gate's users are few\n"  # abpo's own warnings still show
    logged = path.read_text()
    for line in (*CHATTER, "the gate's users are few"):
        assert line in logged, (line, logged)
    # everything is back as it was after the block
    print("after")
    logging.getLogger("abpo_tests_lib.store.db.utils").info("after, the library's line")
    seen = capsys.readouterr()
    assert seen.out == "after\n" and "after, the library's line" in seen.err
    assert "after" not in path.read_text()


def test_with_echo_the_chatter_is_on_the_console_and_in_the_step_log(tmp_path, capsys, console_logging):
    path = tmp_path / "bootstrap.log"
    with warnings.catch_warnings():
        _warnings_shown_as_outside_pytest()
        with step_log(path, echo=True):
            _chatter()
    seen = capsys.readouterr()
    logged = path.read_text()
    for line in CHATTER:
        assert line in seen.out + seen.err and line in logged, line


def test_a_demo_stage_prints_its_line_and_logs_its_chatter(tmp_path, capsys, console_logging):
    log = StepLog(progress=Progress([("prepare", "prepare the data")], t0=0.0))
    with warnings.catch_warnings():
        _warnings_shown_as_outside_pytest()
        log.run("prepare", lambda: (_chatter(), {"users": 610})[1], step_log=tmp_path / "prepare.log")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("prepare the data ... ") and " elapsed, " in lines[0], out
    assert lines[1:] == ["WARNING: the gate's users are few"], out
    assert "{'loss': '7.312'" in (tmp_path / "prepare.log").read_text()
    assert log.steps[0]["step"] == "prepare" and log.steps[0]["users"] == 610
    assert log.progress is not None and len(log.progress.done) == 1


def test_a_library_first_set_up_inside_a_stage_writes_to_the_console_after_it(tmp_path, capsys, console_logging):
    """A library imported during a stage (transformers during the bootstrap) binds its handler to the stderr of that
    moment, the step log; when the stage ends the handler writes to the console again, not to a closed file."""
    lib = logging.getLogger("abpo_tests_lib.store.db.utils")
    with step_log(tmp_path / "bootstrap.log"):
        lib.handlers = [logging.StreamHandler(sys.stderr)]
        lib.propagate = False
        lib.warning("inside")
    lib.warning("after the stage")
    assert "after the stage" in capsys.readouterr().err
    assert "inside" in (tmp_path / "bootstrap.log").read_text()
