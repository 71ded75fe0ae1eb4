"""Every `abpo` command answers bad input with one line on stderr and exit code 2, never a traceback (issue 59 point
10): the commands are walked from the CLI's own parser, and a command without a bad-input case here fails the walk,
so a new command is checked too. The CLI's error boundary (abpo.cli.main) prints abpo.errors.ExpectedError and its
subclasses (UsageError: what an argument check raises) as one line; ``--debug`` adds the traceback. Each case runs
in-process in a throw-away state, as a user would type it; none trains a model."""

from __future__ import annotations

import pytest

from tests.command_names import cli_commands


def _leaf_commands() -> set[str]:
    return {f"{c} {s}" if s else c for c, subs in cli_commands().items() for s in (sorted(subs) if subs else [""])}


# command -> [(argv after the command, what its one line says)]; {tmp}: a directory, {file}: a plain file in it,
# {csv}: a valid counts CSV in it
BAD: dict[str, list[tuple[list[str], str]]] = {
    "config": [(["--set", "report.candidate_arm=<b>x</b>"], "config report.candidate_arm = '<b>x</b>' not in arms")],
    "demo": [(["--months", "0"], "argument --months: --months 0: rule: a whole number of months >= 1")],
    "loop-experiment": [(["--replicates", "many"], "argument --replicates:")],
    "report": [
        (["--csv", "{csv}", "--out", "{file}"], "--out {file}: an existing file, not a directory"),
        (["--csv", "{csv}", "--out", "{file}/sub"], "--out {file}/sub: {file} is a file, not a directory"),
        (["--csv", "{csv}", "--out", "/proc/abpo-report"], "--out /proc/abpo-report: cannot write in /proc"),
        (["--months", "2026-13"], "'2026-13' is not YYYY-MM"),
    ],
    "data prepare": [(["--set", "data.dataset_dir={tmp}/none"], "{tmp}/none/movies.csv: file not found")],
    "data synth": [(["--month", "2026-01", "--landing", "{file}"], "--landing {file}: an existing file")],
    "data ctr": [(["--month", "2026-13"], "argument --month: --month '2026-13'")],
    "data rebuild-aggregates": [(["--month", "x"], "argument --month: --month 'x'")],
    "ingest": [(["--month", "2026-13"], "argument --month: --month '2026-13'")],
    "restore-month": [(["--month", "2026-01", "--version", "x"], "argument --version:")],
    "update": [(["--arm", "nope"], "argument --arm: arm 'nope': unknown; rule: one of")],
    "sft": [(["--max-steps", "x"], "argument --max-steps:")],
    "evaluate": [(["--max-users", "x"], "argument --max-users:")],
    "simulate-log": [(["--month", "2026-01", "--arm", "nope"], "argument --arm: arm 'nope': unknown")],
    "experiment": [(["--rows", "Q"], "experiment.rows: 'Q'; rule: a variant")],
    "simulate": [(["--month", "x"], "argument --month: --month 'x'")],
    "arms bootstrap": [(["--set", "arms.names=nope"], "config arms.names ['nope'] not in data.known_arms")],
    "arms month": [(["--month", "2026-13"], "argument --month: --month '2026-13'")],
    "arms size-update": [
        (["--month", "2026-01", "--arm", "nope"], "argument --arm: arm 'nope': unknown"),
        (["--month", "2026-01", "--grid", "garbage"], "--grid 'garbage'; rule: section.key=value1,value2"),
        (["--month", "2026-01", "--out", "{tmp}"], "--out {tmp}: an existing directory, not a file"),
    ],
    "arms status": [(["--set", "paths.namespace=bad!"], "config paths.namespace = 'bad!'")],
    "arms promote": [(["--arm", "nope", "--version", "1"], "argument --arm: arm 'nope': unknown")],
    "arms rollback": [(["--arm", "nope"], "argument --arm: arm 'nope': unknown")],
    "arms pin": [(["--arm", "nope"], "argument --arm: arm 'nope': unknown")],
    "arms unpin": [(["--arm", "nope"], "argument --arm: arm 'nope': unknown")],
    "arms history": [(["--arm", "nope"], "argument --arm: arm 'nope': unknown")],
    "arms adopt": [(["--arm", "popularity", "--model", "{tmp}/x"], "arm 'popularity' is a ranker arm")],
    "airflow install": [
        (["--dags-folder", "{file}", "--plugins-folder", "{tmp}"], "--dags-folder {file}: not an existing directory")
    ],
    "state relocate": [(["--from", "relative"], "--from relative: rule: the absolute directory")],
}
CASES = [(cmd, argv, says) for cmd, cases in BAD.items() for argv, says in cases]


def test_every_command_has_a_bad_input_case():
    assert set(BAD) == _leaf_commands(), "a command without a bad-input case here, or a case of no command"


def one_line(rc: int, err: str, command: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"abpo {command}: "), (rc, err)
    return lines[0]


@pytest.mark.parametrize("command, argv, says", CASES, ids=[f"{c} {' '.join(a)}" for c, a, _ in CASES])
def test_a_bad_input_is_one_line(abpo, state, tmp_path, command, argv, says):
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "counts.csv").write_text("month,arm,impressions,clicks\n2026-01,abpo,100,10\n2026-01,grpo,100,8\n")
    where = {"tmp": str(tmp_path), "file": str(tmp_path / "afile"), "csv": str(tmp_path / "counts.csv")}
    rc, out, err = abpo(*command.split(), *(a.format(**where) for a in argv))
    line = one_line(rc, err, command)
    assert says.format(**where) in line, line


def test_debug_adds_the_traceback_to_the_one_line(abpo, state, tmp_path):
    (tmp_path / "afile").write_text("x")
    rc, out, err = abpo("arms", "size-update", "--month", "2026-01", "--out", str(tmp_path), "--debug")
    assert rc == 2 and "Traceback (most recent call last)" in err and "UsageError" in err, err
    assert err.strip().splitlines()[-1].startswith("abpo arms size-update: --out ")


def test_arms_month_behind_an_unfinished_month_is_one_line(abpo, state):
    """A month ingested but never finished blocks the next one: the refusal's own message, in one line (it was an
    8-frame traceback: PreviousMonthIncomplete was not one of the CLI's expected errors)."""
    from abpo.config import load_config
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.warehouse import config_catalog, ingest_with_config

    cfg = load_config("tiny")
    catalog = config_catalog(cfg)
    table, _ = synthetic_impressions(200, "2026-01", seed=3, violation_rate=0.0, n_users=50, item_ids=catalog)
    write_impressions(table, cfg.paths.resolve("landing"), "2026-01", part="sim")
    ingest_with_config(cfg, "2026-01")
    rc, out, err = abpo("arms", "month", "--month", "2026-02", "--simulate")
    line = one_line(rc, err, "arms month")
    assert "month 2026-02: earlier month(s) ['2026-01'] were ingested but their cycle never finished" in line
    assert "rerun abpo_monthly for 2026-01 first" in line
    assert not (state / "landing" / "impressions" / "month=2026-02").exists()  # refused before serving


def test_the_output_checks_refuse_before_writing_anything(tmp_path):
    from abpo.errors import UsageError, writable_dir, writable_file

    (tmp_path / "f").write_text("x")
    assert writable_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not created
    assert writable_file(tmp_path / "new" / "table.md") == tmp_path / "new" / "table.md"
    for bad, says in [
        (lambda: writable_dir(tmp_path / "f"), "an existing file"),
        (lambda: writable_dir(tmp_path / "f" / "x"), "is a file, not a directory"),
        (lambda: writable_dir("/proc/abpo-x"), "cannot write in /proc"),
        (lambda: writable_file(tmp_path), "an existing directory"),
        (lambda: writable_file(tmp_path / "f" / "t.md"), "is a file, not a directory"),
    ]:
        with pytest.raises(UsageError, match=says):
            bad()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # no probe left behind
