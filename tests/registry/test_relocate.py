"""A moved state's paths rewritten (abpo.registry.relocate, behind `abpo state relocate`; the whole command on a
copied state: tests/commands/test_state.py). Issue 59 point 1: a --from that is an ancestor of the state (or /)
rewrote every path to <root>/tmp/.../<root>/mlartifacts (421 values in 13 places) and the next month failed with a
FileNotFoundError; only whole path prefixes change, and a --from equal to the state or relative is one line."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from abpo.config import load_config
from abpo.registry import relocate_state


def _store(root, values: list[str]) -> None:
    """``<root>/mlflow.db`` (the state's own store, a real SQLite file) holding ``values`` in a text column."""
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER, artifact_location TEXT)")
        con.executemany("INSERT INTO experiments VALUES (?, ?)", list(enumerate(values)))
        con.commit()


def _values(root) -> list[str]:
    with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as con:
        return [v for (v,) in con.execute("SELECT artifact_location FROM experiments ORDER BY experiment_id")]


def test_relocate_refuses_a_relative_or_same_directory(tmp_path):
    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    with pytest.raises(ValueError, match="rule: the absolute directory"):
        relocate_state(cfg, "var")
    with pytest.raises(ValueError, match="rule: another directory than paths.root"):
        relocate_state(cfg, tmp_path)


def test_only_whole_path_prefixes_change(tmp_path):
    old, root = "/srv/old/var", tmp_path / "var"
    values = [
        f"{old}/mlartifacts/1",  # a path under the old state
        old,  # the old state itself
        f"file://{old}/mlartifacts/2",  # a file URI
        f"sqlite:///{old}/airflow/airflow.db",  # a SQLite URI (four slashes)
        f'{{"path": "{old}/models/x"}}',  # a path inside JSON
        f"{old}2/mlartifacts",  # another directory whose name starts with the old one's: not under it
        f"/mnt{old}/mlartifacts",  # the old path inside another path: not its prefix
        f"s3://bucket{old}/x",  # a key in a bucket
    ]
    _store(root, values)
    cfg = load_config("tiny", [f"paths.root={root}"])
    changed = relocate_state(cfg, old)
    assert changed == {"mlflow.db:experiments.artifact_location": 5}
    assert _values(root) == [
        f"{root}/mlartifacts/1",
        str(root),
        f"file://{root}/mlartifacts/2",
        f"sqlite:///{root}/airflow/airflow.db",
        f'{{"path": "{root}/models/x"}}',
        *values[5:],
    ]
    assert relocate_state(cfg, old) == {}  # a second run changes nothing


@pytest.mark.parametrize("kind", ["ancestor", "slash"])
def test_a_from_that_contains_the_new_root_is_refused(abpo, tmp_path, kind):
    root = tmp_path / "state" / "var"
    old = {"ancestor": str(tmp_path), "slash": "/"}[kind]
    values = [f"{root}/mlartifacts/1", f"{old}/elsewhere/mlartifacts/2"]
    _store(root, values)
    rc, out, err = abpo("state", "relocate", "--set", f"paths.root={root}", "--from", old)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"abpo state relocate: --from {old}: ") and "contains paths.root" in err, err
    assert "rule: " in err
    assert _values(root) == values  # nothing rewritten


@pytest.mark.parametrize("copy", ["base0x", "base0.bak", "base00"])
def test_a_copy_whose_name_extends_the_original_is_relocated(abpo, tmp_path, copy):
    """The directory the state was copied from is compared with the new root by whole path components: a copy
    named base0x (or base0.bak) of base0 is not "under" base0, and its --from is the one StateMoved names."""
    old, root = tmp_path / "base0", tmp_path / copy
    values = [f"{old}/mlartifacts/1", f"sqlite:///{old}/airflow/airflow.db", f"{root}/already/new"]
    _store(root, values)
    rc, out, err = abpo("state", "relocate", "--set", f"paths.root={root}", "--from", str(old))
    assert rc == 0, err
    assert _values(root) == [f"{root}/mlartifacts/1", f"sqlite:///{root}/airflow/airflow.db", f"{root}/already/new"]
    assert abpo("state", "relocate", "--set", f"paths.root={root}", "--from", str(old))[0] == 0  # again: a no-op
    assert _values(root)[0] == f"{root}/mlartifacts/1"


@pytest.mark.parametrize("given", ["relative", "the state"])
def test_a_relative_from_or_the_state_itself_is_one_line(abpo, tmp_path, given):
    root = tmp_path / "var"
    _store(root, [f"{root}/mlartifacts/1"])
    old = "var" if given == "relative" else str(root)
    rc, out, err = abpo("state", "relocate", "--set", f"paths.root={root}", "--from", old)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"abpo state relocate: --from {old}: ") and "rule: " in err, err
