"""Expected errors that ended in a traceback (issue 48, item 9), each now one line on stderr with exit code 2: a copied
state used before relocation (StateMoved), `abpo data synth --n -5`, `abpo arms month` whose report.arm_shares the
simulator would refuse (refused before bootstrap registers anything), an MlflowException in `abpo arms history`
(tests/faults/test_secrets.py: a server that refuses connections), dunder keys in --set."""

from __future__ import annotations

import shutil

import pytest


def _one_line(rc: int, err: str) -> None:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_copied_state_used_before_relocation_is_one_line(abpo, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    old, new = tmp_path / "old" / "var", tmp_path / "new" / "var"
    cfg = load_config("tiny", [f"paths.root={old}"])
    registry.configure(cfg)
    registry._ensure_experiment(cfg, "abpo-arms")  # an artifact location under the old state
    MlflowClient().create_registered_model("abpo-arm-abpo")
    shutil.copytree(old, new)
    monkeypatch.setenv("ABPO_STATE", str(new))
    rc, out, err = abpo("arms", "status")
    _one_line(rc, err)
    assert f"abpo arms status: {new}/mlflow.db: the MLflow store's artifact locations are under {old}" in err, err
    assert f"abpo state relocate --from {old}" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--n", "-5"], "argument --n: --n -5: rule: an integer from 1 to 100,000,000"),
        (["--n", "0"], "argument --n: --n 0: rule"),
        (["--n", "lots"], "argument --n: --n 'lots': rule: an integer"),
        (["--violation-rate", "1.5"], "argument --violation-rate: --violation-rate 1.5: rule: a number in [0, 1]"),
    ],
)
def test_data_synth_with_a_bad_count_is_one_argparse_line(abpo, state, argv, says):
    rc, out, err = abpo("data", "synth", "--month", "2026-01", *argv)
    assert rc == 2 and "Traceback" not in err and says in err, err
    assert not (state / "landing").exists()


def test_a_month_whose_shares_the_simulator_refuses_is_refused_before_bootstrap(abpo, state):
    rc, out, err = abpo(
        "arms",
        "month",
        "--month",
        "2026-01",
        "--simulate",
        "--set",
        "report.arm_shares={abpo: 0.5, grpo: 0.2, ml_retrain: 0.1, popularity: 0.1}",
    )
    _one_line(rc, err)
    assert "config report.arm_shares over arms ['abpo', 'grpo', 'ml_retrain', 'popularity'] sum to 0.900000" in err
    assert "nothing was run" in err
    assert not (state / "mlflow.db").exists() and not (state / "models").exists()  # nothing trained or registered


@pytest.mark.parametrize(
    "setting",
    ["__class__.name=x", "paths.__class__.URI_FIELDS=x", "__dict__=x", "update.__init__=1", "seed.__class__=1"],
)
def test_a_dunder_key_in_set_is_one_line_and_changes_nothing(abpo, state, setting):
    from abpo.config import Config
    from abpo.config.paths import PathsConfig

    rc, out, err = abpo("config", "--set", setting)
    _one_line(rc, err)
    assert "abpo config: --set: " in err and ("no section" in err or "unknown key" in err), err
    assert PathsConfig.URI_FIELDS == ("landing", "mlflow_artifacts") and Config.name == "tiny"
