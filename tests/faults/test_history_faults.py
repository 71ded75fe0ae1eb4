"""The promotion history's text cannot be forged (issue 48, item 8): --reason, --actor and $ABPO_ACTOR with a
control character (newline, carriage return, NUL, a right-to-left override) are refused before anything is recorded,
and `abpo arms history --json` prints only JSON on stdout."""

from __future__ import annotations

import json

import pytest

from tests.faults.registry_versions import registry_with_versions

FORGED = [
    ("newline", "hotfix\nabpo        #9    2026-01-01T00:00:00+00:00  promote      v1 -> v9 by ceo: approved"),
    ("carriage return", "hotfix\rapproved by the CEO"),
    ("NUL", "hotfix\x00hidden"),
    ("right-to-left override", "hotfix \u202edevorppa"),
    ("line separator", "hotfix\u2028approved"),
]


def _champion_and_history(state) -> tuple[str, list]:
    from abpo.arms import history, versions as arm_versions
    from abpo.config import load_config

    cfg = load_config("tiny")
    return str(arm_versions.get_version(cfg, "abpo", "champion").version), history.entries(cfg, "abpo")


@pytest.mark.parametrize("what, text", FORGED, ids=[f[0] for f in FORGED])
@pytest.mark.parametrize("option", ["--reason", "--actor"])
def test_a_control_character_in_reason_or_actor_is_refused_and_nothing_recorded(abpo, state, option, what, text):
    registry_with_versions(state, 2)
    before = _champion_and_history(state)
    rc, out, err = abpo("arms", "promote", "--arm", "abpo", "--version", "2", option, text)
    assert rc == 2 and "Traceback" not in err, err
    assert f"argument {option}:" in err and "rule: a history field is one line of printable text" in err, err
    assert _champion_and_history(state) == before  # champion v1, no entry
    for action in ("pin", "rollback"):
        rc, out, err = abpo("arms", action, "--arm", "abpo", option, text)
        assert rc == 2 and f"argument {option}:" in err, err


def test_a_control_character_in_abpo_actor_is_refused_by_the_history_itself(abpo, state, monkeypatch):
    """$ABPO_ACTOR does not go through argparse: the history's own check (every writer) refuses it, one line."""
    registry_with_versions(state, 2)
    monkeypatch.setenv("ABPO_ACTOR", "alice\nbob")
    rc, out, err = abpo("arms", "promote", "--arm", "abpo", "--version", "2")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "actor 'alice\\nbob': character 6 is U+000A" in err, err
    champion, entries = _champion_and_history(state)
    assert champion == "1" and not [e for e in entries if e.action == "promote"]


def test_printable_unicode_is_recorded_as_given(abpo, state):
    registry_with_versions(state, 2)
    reason = "régression corrigée — 修正 (ticket #42)"
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "2", "--reason", reason, "--actor", "zoë")[0] == 0
    champion, entries = _champion_and_history(state)
    assert champion == "2" and entries[-1].reason == reason and entries[-1].actor == "zoë"


def test_history_json_prints_only_json_on_stdout(abpo, state):
    registry_with_versions(state, 2)
    assert abpo("arms", "promote", "--arm", "abpo", "--version", "2", "--reason", "r")[0] == 0
    from abpo import registry

    registry._announced.clear()  # a new process: the store line is logged on the first use of the store
    rc, out, err = abpo("arms", "history", "--arm", "abpo", "--json")
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines), out
    assert [json.loads(line)["action"] for line in lines][-1] == "promote"
    assert "MLflow store" in err and "MLflow store" not in out
