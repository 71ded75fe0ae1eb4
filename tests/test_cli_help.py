"""The `abpo` command's surface: every command the README and abpo's own messages name exists; `abpo arms ACTION`
has per-action help; help is rich-argparse's (plain text in a pipe); argcomplete completes subcommands and options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.command_names import cli_commands, named_commands, unknown_commands

REPO = Path(__file__).resolve().parents[1]
ABPO = str(Path(sys.executable).with_name("abpo"))


def test_the_readme_and_the_messages_name_only_commands_that_exist():
    commands = cli_commands()
    assert {"restore-month", "ingest", "airflow"} <= set(commands) and commands["data"] >= {"prepare", "synth"}
    sources = [
        REPO / "README.md",
        *(p for p in REPO.glob("docs/**/*.md") if "experiments" not in p.parts),
        *(REPO / "abpo").rglob("*.py"),
        REPO / "dags" / "abpo_monthly.py",
        REPO / "plugins" / "abpo_plugin.py",
        *(REPO / "configs").glob("*.yaml"),
    ]
    found = {str(f.relative_to(REPO)): named_commands(f.read_text()) for f in sources}
    assert sum(len(v) for v in found.values()) > 100  # the pattern does find the references
    bad = {f: b for f, named in found.items() if (b := unknown_commands(named, commands))}
    assert not bad, bad


def test_the_check_catches_a_wrong_command_name():
    commands = cli_commands()
    assert unknown_commands(
        named_commands("use `abpo data restore-month --month M` or `abpo data ingest --force`"), commands
    ) == [
        "data restore-month",
        "data ingest",
    ]
    assert unknown_commands(named_commands("```\n.venv/bin/abpo arms mnth --month 2026-01\n```"), commands) == [
        "arms mnth"
    ]


def _help(*argv: str) -> str:
    p = subprocess.run(
        [ABPO, *argv, "--help"], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"}
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_arms_has_one_subcommand_per_action_with_only_its_flags():
    top = _help("arms")
    for action in ("bootstrap", "month", "status", "promote", "rollback"):
        assert action in top
    month = _help("arms", "month")
    assert "--month MONTH" in month and "--simulate" in month
    assert "--arm" not in month and "--expect-champion" not in month and "--version" not in month
    promote = _help("arms", "promote")
    assert "--arm ARM" in promote and "--version VERSION" in promote and "--simulate" not in promote
    p = subprocess.run([ABPO, "arms", "month"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "the following arguments are required: --month" in p.stderr


def test_help_is_rich_argparse_and_plain_in_a_pipe():
    from rich_argparse import RichHelpFormatter

    from abpo.cli import build_parser

    assert issubclass(build_parser().formatter_class, RichHelpFormatter)
    text = _help("airflow", "install")
    assert "\x1b[" not in text  # no colour codes when stdout is not a terminal
    assert "[core] dags_folder" in text  # brackets in help texts are text, not rich markup
    assert text.startswith("Usage: abpo airflow install")  # rich-argparse's heading, not argparse's "usage:"


def _complete(line: str) -> list[str]:
    """What the shell gets back from argcomplete for ``line`` (the cursor at its end)."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"abpo-complete-{os.getpid()}"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        "_ARGCOMPLETE_SUPPRESS_SPACE": "1",
    }
    try:
        p = subprocess.run([ABPO], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return out.read_text().split("\n")
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "line, want, not_want",
    [
        ("abpo ar", {"arms"}, {"report"}),
        ("abpo arms ", {"bootstrap", "month", "status", "promote", "rollback"}, {"--arm"}),
        ("abpo arms month --", {"--month", "--simulate", "--config"}, {"--arm", "--version"}),
        ("abpo restore", {"restore-month"}, set()),
    ],
)
def test_argcomplete_completes_commands_and_each_actions_own_flags(line, want, not_want):
    got = {w.strip() for w in _complete(line)}
    assert want <= got and not (not_want & got), got


def test_the_entry_point_module_carries_the_argcomplete_marker():
    # register-python-argcomplete's shell hook only asks scripts whose module starts with this marker
    assert "PYTHON_ARGCOMPLETE_OK" in (REPO / "abpo" / "cli.py").read_text()[:1024]
