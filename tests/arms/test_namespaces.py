"""paths.namespace: two environments on one MLflow store keep disjoint registered models (arms, pi_init, locks),
aliases and experiments; the default (no namespace) leaves every name, and the config hash, as they were."""

from __future__ import annotations

import hashlib
import json

import pytest

from abpo import registry
from abpo.arms import history, promotion, promotion_lock, versions as arm_versions
from abpo.arms.promotion import PIN_TAG
from abpo.config import load_config


def _env(tmp_path, ns: str, store: str, *extra: str):
    return load_config(
        "tiny",
        [
            f"paths.root={tmp_path / (ns or 'plain')}",
            f"paths.mlflow_tracking_uri={store}",
            f"paths.namespace={ns}",
            *extra,
        ],
    )


def _register(cfg, tmp_path, marker: int):
    ckpt = tmp_path / f"ckpt-{cfg.paths.namespace}-{marker}"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "marker": marker}))
    with registry.start_run(cfg, arm_versions.EXPERIMENT, f"r{marker}") as run:
        uri = registry.log_model_dir(ckpt)
    return arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, {}, alias=registry.CHALLENGER)


def test_the_default_names_and_config_hash_are_unchanged():
    from abpo.arms.names import lock_name, model_name

    cfg = load_config("tiny")
    assert (model_name("abpo"), lock_name("abpo")) == ("abpo-arm-abpo", "abpo-lock-abpo")
    assert arm_versions.model_name("grpo", cfg) == "abpo-arm-grpo" and registry.model_name(cfg) == "abpo-recommender"
    assert registry.experiment_name(cfg, "abpo-arms") == "abpo-arms"
    d = cfg.to_dict()
    del d["paths"]["namespace"]  # the hash of before the key existed
    if d["paths"]["root"].startswith("/"):  # an absolute state directory hashes as where a state is, not which one
        d["paths"]["root"] = arm_versions.ROOT_IN_HASH  # (a relocated copy keeps its task keys)
    assert (
        arm_versions.config_hash(cfg)
        == hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    )
    ns = load_config("tiny", ["paths.namespace=staging"])
    assert arm_versions.config_hash(ns) != arm_versions.config_hash(cfg)
    assert (arm_versions.model_name("abpo", ns), registry.model_name(ns)) == (
        "staging-abpo-arm-abpo",
        "staging-abpo-recommender",
    )
    assert registry.experiment_name(ns, ns.update.mlflow_experiment) == "staging-abpo-update"
    with pytest.raises(ValueError, match="paths.namespace = 'Prod X': rule"):
        load_config("tiny", ["paths.namespace=Prod X"])


def test_two_namespaces_on_one_store_touch_only_their_own_names(tmp_path):
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'shared.db'}"
    staging, prod = _env(tmp_path, "staging", store), _env(tmp_path, "prod", store)
    s1 = _register(staging, tmp_path, 1)
    p1 = _register(prod, tmp_path, 1)
    p2 = _register(prod, tmp_path, 2)
    promotion.promote(staging, "abpo", s1.version)
    with promotion_lock.promotion_lock(staging, "abpo"):  # staging's lock does not block prod's promotion
        promotion.promote(prod, "abpo", p2.version, reason="test")
    assert str(arm_versions.get_version(staging, "abpo", registry.CHAMPION).version) == str(s1.version) == "1"
    assert str(arm_versions.get_version(prod, "abpo", registry.CHAMPION).version) == str(p2.version) == "2"
    assert str(p1.version) == "1"
    registry.configure(staging)
    client = MlflowClient()
    models = {m.name: m for m in client.search_registered_models()}
    assert set(models) == {"staging-abpo-arm-abpo", "prod-abpo-arm-abpo"}  # no lock left, no un-namespaced name
    assert {k: str(v) for k, v in models["staging-abpo-arm-abpo"].aliases.items()} == {
        "champion": "1",
        "challenger": "1",
    }
    assert {k: str(v) for k, v in models["prod-abpo-arm-abpo"].aliases.items()} == {"champion": "2", "challenger": "2"}
    exps = {e.name for e in client.search_experiments()} - {"Default"}
    assert exps == {"staging-abpo-arms", "prod-abpo-arms", "staging-abpo-promotions", "prod-abpo-promotions"}
    # the promotion history and the pin are each environment's own
    assert [(e.action, e.to_version) for e in history.entries(prod, "abpo") if e.moved] == [("promote", "2")]
    assert [(e.action, e.to_version) for e in history.entries(staging, "abpo") if e.moved] == [("promote", "1")]
    promotion.pin(staging, "abpo", reason="freeze", actor="test")
    assert promotion.pinned(staging, "abpo") is not None and promotion.pinned(prod, "abpo") is None
    assert PIN_TAG in (client.get_registered_model("staging-abpo-arm-abpo").tags or {})
    assert [e.action for e in history.entries(staging, "abpo")][-1] == "pin"
    assert "pin" not in [e.action for e in history.entries(prod, "abpo")]


@pytest.mark.slow
def test_two_namespaces_on_one_store_each_run_a_month(tmp_path):
    """Two environments (own state, namespaces staging / prod) on ONE MLflow store each run month 2026-01 of the
    shrunken cycle: every registered model, alias and experiment of one is the other's with its own prefix, and
    nothing is registered without a prefix."""
    from mlflow import MlflowClient

    from abpo.monthly.month import run_month
    from tests.sizes import CYCLE_MONTH, GATE_PASSES

    store = f"sqlite:///{tmp_path / 'shared.db'}"
    envs = {ns: _env(tmp_path, ns, store, *CYCLE_MONTH, *GATE_PASSES) for ns in ("staging", "prod")}
    out = {ns: run_month(cfg, "2026-01").to_json() for ns, cfg in envs.items()}
    registry.configure(envs["staging"])
    client = MlflowClient()
    names = {
        ns: {
            m.name.removeprefix(f"{ns}-"): {k: str(v) for k, v in m.aliases.items()}
            for m in client.search_registered_models()
            if m.name.startswith(f"{ns}-")
        }
        for ns in envs
    }
    every = {m.name for m in client.search_registered_models()}
    assert every == {f"{ns}-{n}" for ns in envs for n in names[ns]}  # every name carries one of the prefixes
    assert (
        set(names["staging"])
        == set(names["prod"])
        == {"abpo-recommender", *(f"abpo-arm-{a}" for a in ("abpo", "grpo", "ml_retrain", "popularity"))}
    )
    for ns in envs:  # each champion is the version its own month promoted
        for arm in ("abpo", "grpo"):
            assert names[ns][f"abpo-arm-{arm}"]["champion"] == str(out[ns][arm]["promote"]["champion_version"])
    exps = {e.name for e in client.search_experiments()} - {"Default"}
    assert exps and all(e.startswith(("staging-", "prod-")) for e in exps)
    assert {e.removeprefix("staging-") for e in exps if e.startswith("staging-")} == {
        e.removeprefix("prod-") for e in exps if e.startswith("prod-")
    }
