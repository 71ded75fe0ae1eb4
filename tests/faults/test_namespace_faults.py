"""A state runs only in its own environment (issue 48, item 1): a state made with paths.namespace records it
(<state>/namespace.json) and refuses to run under another namespace, the default included, before anything reads or
writes the registry; a state made before the record existed is judged by the names its store and model cache hold."""

from __future__ import annotations

import json
import sqlite3

import pytest


def _two_environments(state, monkeypatch):
    """One MLflow store (a SQLite file outside both states) holding the default environment's abpo-arm-popularity
    (champion v1) and the staging state's staging-abpo-arm-popularity (champion v1)."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    monkeypatch.setenv("ABPO_TRACKING_URI", f"sqlite:///{state.parent / 'shared-mlflow.db'}")
    for ns, root in (("", state.parent / "prod-var"), ("staging", state)):
        cfg = load_config("tiny", [f"paths.root={root}", f"paths.namespace='{ns}'"])
        registry.configure(cfg)
        name = registry.experiment_name(cfg, "abpo-arm-popularity")  # <ns>-abpo-arm-popularity
        MlflowClient().create_registered_model(name)
        MlflowClient().create_model_version(name, source=(root / "nothing").as_uri())
        MlflowClient().set_registered_model_alias(name, "champion", "1")


def test_a_namespaced_state_run_without_its_namespace_is_refused(abpo, state, monkeypatch):
    _two_environments(state, monkeypatch)
    assert json.loads((state / "namespace.json").read_text()) == {"namespace": "staging"}
    from abpo.registry import store

    store._checked_namespace.clear()  # a new process
    monkeypatch.delenv("ABPO_NAMESPACE", raising=False)
    for argv in (("arms", "status"), ("arms", "pin", "--arm", "popularity"), ("arms", "history")):
        rc, out, err = abpo(*argv)
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"state {state} belongs to namespace 'staging'" in err and "not '' (no namespace)" in err, err
        assert "set ABPO_NAMESPACE=staging" in err
    from mlflow import MlflowClient

    assert not MlflowClient().get_registered_model("abpo-arm-popularity").tags  # nothing pinned in the other env
    monkeypatch.setenv("ABPO_NAMESPACE", "prod")
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and "not 'prod'" in err, err
    monkeypatch.setenv("ABPO_NAMESPACE", "staging")
    rc, out, err = abpo("arms", "status")
    assert rc == 0 and "staging-abpo-arm-popularity" in out, err


def test_a_state_made_before_the_record_is_judged_by_the_names_it_holds(abpo, state, monkeypatch):
    from abpo import registry
    from abpo.config import load_config
    from abpo.registry import store

    monkeypatch.setenv("ABPO_NAMESPACE", "staging")
    cfg = load_config("tiny")
    registry.configure(cfg)
    registry._ensure_experiment(cfg, "abpo-arms")  # staging-abpo-arms in the state's own store
    (state / "namespace.json").unlink()  # as an older abpo left it
    store._checked_namespace.clear()
    monkeypatch.delenv("ABPO_NAMESPACE")
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and f"state {state} belongs to namespace 'staging' (found in the state's MLflow store" in err, err
    assert not (state / "namespace.json").exists()
    with sqlite3.connect(state / "mlflow.db") as con:
        assert [n for (n,) in con.execute("SELECT name FROM experiments")] == ["Default", "staging-abpo-arms"]
    monkeypatch.setenv("ABPO_NAMESPACE", "staging")
    assert abpo("arms", "status")[0] == 0
    assert json.loads((state / "namespace.json").read_text()) == {"namespace": "staging"}


def test_a_namespace_mismatch_is_a_refusal_for_the_dag():
    from abpo.monthly.common import retry_or_fail
    from abpo.registry import NamespaceMismatch

    assert retry_or_fail(NamespaceMismatch("x")) == "fail"


@pytest.mark.parametrize("text", ["not json", '{"ns": "x"}'])
def test_an_unreadable_record_is_one_line(abpo, state, text):
    state.mkdir(parents=True)
    (state / "namespace.json").write_text(text)
    rc, out, err = abpo("arms", "status")
    assert rc == 2 and f"{state}/namespace.json: unreadable" in err and "Traceback" not in err, err
