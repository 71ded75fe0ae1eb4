"""A registered checkpoint served through MLflow (pyfunc, loader abpo.serving) ranks a request's candidates
exactly as the policy code scores them: same prompt (chat template, budget), same s_p and e_p."""

import csv
from pathlib import Path

import pandas as pd
import pytest
import torch

from abpo import registry
from abpo.config import load_config
from tests.sizes import TINY_MODEL, without

REPO = Path(__file__).resolve().parents[1]
SERVED_MODEL = without(TINY_MODEL, "policy.tiny_layers")  # the preset's 2 layers


@pytest.fixture(scope="module")
def titles():
    with open(REPO / "data" / "ml-latest-small" / "movies.csv", newline="", encoding="utf-8") as f:
        return {int(r["movieId"]): r["title"] for r in list(csv.DictReader(f))[:300]}


def _registered_challenger(tmp_path, titles, *overrides: str):
    """A tiny model of :data:`SERVED_MODEL` sizes and ``overrides`` built on ``titles``, logged and registered as the
    challenger (one torch thread); returns the config and the checkpoint directory."""
    from abpo.policy.model import build_tiny

    torch.set_num_threads(1)
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *SERVED_MODEL, *overrides])
    ckpt = build_tiny(cfg.policy, cfg.paths, titles, seed=0)
    with registry.start_run(cfg, "test-serving", "serve"):
        uri = registry.log_model_dir(ckpt, policy_cfg=cfg.policy)
    registry.register(uri)
    return cfg, ckpt


def test_registered_model_serves_same_scores(tmp_path, titles):
    import mlflow

    from abpo.policy.prompt import fit_prompt, format_answer
    from abpo.policy.scoring import candidate_propensities, score_candidates
    from abpo.serving import load_checkpoint

    cfg, ckpt = _registered_challenger(
        tmp_path, titles, "policy.tau=0.7", "policy.max_history=3", "policy.prompt_style=text"
    )
    ids = list(titles)[:6]
    history = [titles[i] for i in list(titles)[10:15]]
    served = mlflow.pyfunc.load_model(f"models:/{registry.MODEL_NAME}@{registry.CHALLENGER}")
    out = served.predict(
        pd.DataFrame(
            {"history_titles": [history], "candidate_ids": [ids], "candidate_titles": [[titles[i] for i in ids]]}
        )
    )

    model, tok = load_checkpoint(ckpt)
    prompt = fit_prompt(
        tok, history, [(i, titles[i]) for i in ids], max_history=3, max_prompt_tokens=cfg.policy.max_prompt_tokens
    ).text
    s = score_candidates(
        model, tok, prompt, [format_answer(i, titles[i]) for i in ids], batch_tokens=cfg.policy.scoring_batch_tokens
    )
    e = candidate_propensities(s, 0.7)
    assert torch.allclose(torch.tensor(out["propensities"][0]), e, atol=1e-5)
    assert abs(sum(out["propensities"][0]) - 1) < 1e-5
    assert out["ranked_item_ids"][0] == [ids[j] for j in s.argsort(descending=True).tolist()]


def test_item_token_model_serves_its_item_token_scores(tmp_path, titles):
    """A model logged with policy.prompt_style=item_tokens serves e_p from the item-token scores of the same
    prompt the policy code builds (history ids required)."""
    import mlflow

    from abpo.data.candidates import Example
    from abpo.policy.scoring import candidate_propensities, score_examples
    from abpo.serving import load_checkpoint

    cfg, ckpt = _registered_challenger(tmp_path, titles, "policy.tau=0.7", "policy.prompt_style=item_tokens")
    ids, hist = list(titles)[:6], list(titles)[10:40]
    served = mlflow.pyfunc.load_model(f"models:/{registry.MODEL_NAME}@{registry.CHALLENGER}")
    req = {
        "history_titles": [[titles[i] for i in hist]],
        "candidate_ids": [ids],
        "candidate_titles": [[titles[i] for i in ids]],
    }
    with pytest.raises(ValueError, match="history_item_ids"):
        served.predict(pd.DataFrame(req))
    out = served.predict(pd.DataFrame({**req, "history_item_ids": [hist]}))
    model, tok = load_checkpoint(ckpt)
    s = score_examples(model, tok, [Example("r", 0, hist, ids, ids[0])], titles, cfg.policy)[0].scores
    assert torch.allclose(torch.tensor(out["propensities"][0]), candidate_propensities(s, 0.7), atol=1e-5)
    assert out["ranked_item_ids"][0] == [ids[j] for j in s.argsort(descending=True).tolist()]


def test_bad_request_names_the_row(tmp_path, titles):
    from abpo.policy.model import build_tiny
    from abpo.serving import _load_pyfunc

    cfg = load_config(
        "tiny",
        [
            f"paths.root={tmp_path}",
            *SERVED_MODEL,
        ],
    )
    served = _load_pyfunc(str(build_tiny(cfg.policy, cfg.paths, titles, seed=0)), {"tau": 1.0})
    with pytest.raises(ValueError, match="row 0: candidate_ids and candidate_titles"):
        served.predict(pd.DataFrame({"history_titles": [[]], "candidate_ids": [[1, 2]], "candidate_titles": [["a"]]}))
