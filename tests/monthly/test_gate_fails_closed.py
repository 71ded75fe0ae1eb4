"""Issue 32 item 8: a challenger whose weights are NaN (so are its scores) fails the gate closed, with the reason
recorded (the version's tags, the gate's MLflow run, the task result), and is not promoted; before, the gate raised
ValueError (target_rank: a NaN score), so the month could not complete. A challenger scoring fine passes the same
gate. Real tiny models (the champion adopted, the challenger the same checkpoint with its weights set to NaN) and
MLflow; the gate's users are the configured (synthetic MovieLens) dataset's."""

from __future__ import annotations

import shutil

from tests.sizes import TINY_MODEL

SMALL_MODEL = [
    *TINY_MODEL,
    "data.eval_candidates=10",
    "arms.gate_max_users=20",
    # 20 tied users pass Tango's score test only at a wide margin (n m / (1 - m) > 1.96^2: m > 0.16); at 0.02 they
    # say nothing (about 0.4 would have lost under the margin)
    "arms.gate_margin=0.5",
]


def _register(cfg, arm_versions, model_dir, tags):
    from abpo.monthly.common import CHALLENGER, start_run

    with start_run(cfg, "challenger", {}) as run:
        uri = arm_versions.log_arm_model(cfg, "abpo", model_dir)
    return str(arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, tags, alias=CHALLENGER).version)


def test_a_challenger_with_nan_weights_fails_the_gate_closed_and_is_not_promoted(
    make_cfg, movielens_dir, build_tiny_model, tmp_path
):
    from safetensors.torch import load_file, save_file

    from abpo.arms import versions as arm_versions
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.gate import gate
    from abpo.monthly.promote import promote

    cfg = make_cfg(f"data.dataset_dir={movielens_dir(60, 40, ratings_per_user=12)}", *SMALL_MODEL)
    ds, _ = dataset_and_splits(cfg)
    model_dir = build_tiny_model(cfg.policy, ds.titles())
    champion = adopt_model(cfg, "abpo", model_dir).version
    broken = tmp_path / "nan-model"
    shutil.copytree(model_dir, broken)
    weights = broken / "model.safetensors"
    save_file(
        {k: v.float().fill_(float("nan")) if v.is_floating_point() else v for k, v in load_file(weights).items()},
        weights,
        metadata={"format": "pt"},
    )
    nan = _register(cfg, arm_versions, broken, {"source": "update", "parent_version": champion})

    res = gate(cfg, "abpo", nan)  # the DAG's gate task and `abpo arms month` run this step
    assert not res.passed and res.champion_version == champion
    assert f"challenger v{nan}: request " in res.reason and "candidate scores not finite" in res.reason
    assert "fails closed (non_finite_scores)" in res.reason
    tags = arm_versions.get_version(cfg, "abpo", nan).tags
    assert tags["gate.verdict"] == "fail" and "non_finite_scores" in tags["gate.reason"]
    out = promote(cfg, "abpo", res, "2026-01")
    assert not out.promoted and not out.moved and out.champion_version == champion
    # the same gate passes a challenger that scores (the champion's own weights: every user tied)
    fine = _register(cfg, arm_versions, model_dir, {"source": "update", "parent_version": champion})
    assert gate(cfg, "abpo", fine).passed
