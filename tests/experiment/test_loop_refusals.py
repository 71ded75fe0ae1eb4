"""`abpo loop-experiment` checks every argument and every saved result before any work, each refusal one line on
stderr with exit code 2 (issue 59 point 4): --replicates / --months / --workers out of range, a config that sets
sim.replicate, a --target-mde that is not 0 or a finite size (1e-300 divided by zero in the sizing; nan and -1 meant no
sizing, silently), an --out that is a file or cannot be written (found only after every replicate had run), and a
replicate's result.json that is not an object, not JSON, or holds non-finite moments.

Each case starts from a state in which replicate 0 of one month is finished (its result.json written as a run
holding the state's lock writes it), so a command that does not refuse runs no training: it only reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

MONTHS = ["2026-01"]


def _one_line(rc: int, err: str) -> str:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _moments(arms: list[str]) -> list[dict]:
    rows = []
    for period in [*MONTHS, "all"]:
        for i, arm in enumerate(arms):
            clicks, imps = 10 + i, 200
            rows.append(
                {
                    "period": period,
                    "arm": arm,
                    "users": 50,
                    "clicks": clicks,
                    "impressions": imps,
                    "clicks_sq": 3 * clicks,
                    "impressions_sq": imps * imps / 50 + 40,
                    "clicks_x_impressions": clicks * imps / 50 + 5,
                }
            )
    return rows


def finished_replicate(root: Path, **replace) -> Path:
    """result.json of replicate 0 over :data:`MONTHS` under ``root`` (the state), as a finished run records it;
    ``replace`` sets its fields. Returns its path."""
    import dataclasses

    from abpo.config import load_config
    from abpo.experiment.loop_experiment import DIR
    from abpo.experiment.loop_fingerprints import replicate_fingerprint
    from abpo.monthly.common import arms_of

    cfg = load_config("tiny", [f"paths.root={root}"])
    fp = replicate_fingerprint(dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, replicate=0)), MONTHS)
    path = root / DIR / "replicates" / fp / "result.json"
    path.parent.mkdir(parents=True)
    result = {
        "fingerprint": fp,
        "code": "made-by-the-test",
        "replicate": 0,
        "run": "run-of-the-test",
        "clean": True,
        "salt": cfg.sim.salt,
        "months": [{"month": m, "seconds": 1.0, "served": {}, "arms": {}} for m in MONTHS],
        "moments": _moments(arms_of(cfg)),
        "seconds": 1.0,
        "threads": 1,
        "state": str(path.parent / "state"),
        **replace,
    }
    path.write_text(json.dumps(result))
    return path


RUN = ("loop-experiment", "--replicates", "1", "--months", "1", "--any-code")


def test_a_finished_replicate_is_reported_without_work(abpo, state, tmp_path):
    """The set-up of the refusals below: replicate 0 finished, the command reports it and runs nothing."""
    finished_replicate(state)
    rc, out, err = abpo(*RUN, "--out", str(tmp_path / "report"))
    assert rc == 0, err
    assert (tmp_path / "report" / "report.md").is_file() and "1 replicate(s) in" in out
    assert not (state / "loop-experiment" / "bootstrap").exists()  # nothing trained


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--replicates", "0"], "--replicates 0: rule: an integer >= 1"),
        (["--replicates", "-3"], "--replicates -3: rule: an integer >= 1"),
        (["--months", "0"], "--months 0: rule: an integer >= 1"),
        (["--workers", "-1"], "--workers -1: rule: 0 (the machine's cores) or an integer >= 1"),
        (["--set", "sim.replicate=2"], "config sim.replicate = 2: rule: 0"),
        (["--target-mde", "1e-300"], "--target-mde 1e-300: rule: 0 (no sizing) or a number of percentage points"),
        (["--target-mde", "nan"], "--target-mde nan: rule: 0 (no sizing) or a number of percentage points"),
        (["--target-mde", "-1"], "--target-mde -1.0: rule: 0 (no sizing) or a number of percentage points"),
        (["--target-mde", "inf"], "--target-mde inf: rule: 0 (no sizing) or a number of percentage points"),
        (["--target-mde", "500"], "--target-mde 500.0: rule: 0 (no sizing) or a number of percentage points"),
    ],
)
def test_each_argument_out_of_range_is_one_line_before_any_work(abpo, state, tmp_path, argv, says):
    result = finished_replicate(state)
    before = result.read_text()
    out_dir = tmp_path / "report"
    rc, out, err = abpo(*RUN, "--out", str(out_dir), *argv)
    line = _one_line(rc, err)
    assert line.startswith("abpo loop-experiment: ") and says in line, line
    assert not out_dir.exists() and result.read_text() == before
    assert not (state / "loop-experiment" / "reports").exists()


def test_an_out_that_is_a_file_or_cannot_be_written_is_one_line_before_any_work(abpo, state, tmp_path):
    finished_replicate(state)
    a_file = tmp_path / "report.md"
    a_file.write_text("mine")
    for out_dir, says in [
        (a_file, f"--out {a_file}: an existing file, not a directory; rule: "),
        (a_file / "sub", f"--out {a_file / 'sub'}: {a_file} is a file, not a directory; rule: "),
        (Path("/sys/abpo-loop-experiment-test/out"), "--out /sys/abpo-loop-experiment-test/out: cannot write in /sys"),
    ]:
        rc, out, err = abpo(*RUN, "--out", str(out_dir))
        line = _one_line(rc, err)
        assert line.startswith("abpo loop-experiment: ") and says in line, line
        assert a_file.read_text() == "mine"
    assert not (state / "loop-experiment" / "reports").exists()


@pytest.mark.parametrize(
    "content, says",
    [
        ("[]", "a list, not an object"),
        ("{not json", "not JSON (JSONDecodeError"),
        ("", "not JSON (JSONDecodeError"),
        (None, "moments[2].clicks NaN"),
        ("moments-string", "moments: a str, not a list"),
        ("months-short", 'months ["2026-02"]; rule: the months of this run, ["2026-01"]'),
    ],
)
def test_a_damaged_result_is_one_line_naming_the_file_and_field(abpo, state, content, says):
    if content is None:
        path = finished_replicate(state)
        got = json.loads(path.read_text())
        got["moments"][2]["clicks"] = float("nan")
        path.write_text(json.dumps(got))  # json writes NaN
    elif content == "moments-string":
        path = finished_replicate(state, moments="x")
    elif content == "months-short":
        path = finished_replicate(state, months=[{"month": "2026-02", "seconds": 1.0}])
    else:
        path = finished_replicate(state)
        path.write_text(content)
    rc, out, err = abpo(*RUN, "--target-mde", "0")
    line = _one_line(rc, err)
    assert f"{path}: " in line and says in line and "rule: " in line, line
    assert f"remove {path.parent} to run replicate 0 again" in line, line
    assert not (state / "loop-experiment" / "bootstrap").exists()
