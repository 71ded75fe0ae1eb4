"""load_policy: the tiny model (built once, cached, deterministic), local directories, LoRA, presets."""

from __future__ import annotations

import pytest
import torch

from abpo.config.paths import PathsConfig


class _Catalog:
    """The one thing load_policy needs from a Dataset for `tiny`: titles()."""

    def __init__(self, titles):
        self._titles = titles

    def titles(self):
        return dict(self._titles)


def test_tiny_is_cached_and_deterministic(small_policy_cfg, small_titles, tmp_path):
    from abpo.policy.model import load_policy, tiny_dir

    paths_a, paths_b = PathsConfig(root=str(tmp_path / "a")), PathsConfig(root=str(tmp_path / "b"))
    m1, t1 = load_policy(small_policy_cfg, paths_a, dataset=_Catalog(small_titles), seed=3)
    d = tiny_dir(small_policy_cfg, paths_a, small_titles, 3)
    assert (d / "config.json").exists() and (d / "tokenizer.json").exists()
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    m2, _ = load_policy(small_policy_cfg, paths_a, dataset=_Catalog(small_titles), seed=3)  # reuses the cache
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime
    m3, t3 = load_policy(small_policy_cfg, paths_b, dataset=_Catalog(small_titles), seed=3)  # rebuilt elsewhere
    assert t1.get_vocab() == t3.get_vocab()
    for (n, p1), (_, p3) in zip(m1.named_parameters(), m3.named_parameters(), strict=True):
        assert torch.equal(p1, p3), n
    m4, _ = load_policy(small_policy_cfg, paths_a, dataset=_Catalog(small_titles), seed=4)
    assert not torch.equal(m1.lm_head.weight, m4.lm_head.weight)  # the seed matters
    assert t1.eos_token == "<|end|>" and t1.pad_token == "<|pad|>" and t1.chat_template
    # digits are single tokens, the answer markup one token each
    assert t1.tokenize("193609") == list("193609")
    assert len(t1("<item_id>", add_special_tokens=False)["input_ids"]) == 1


def test_tiny_needs_the_dataset(small_policy_cfg, tmp_path):
    from abpo.policy.model import load_policy

    with pytest.raises(ValueError, match="dataset="):
        load_policy(small_policy_cfg, PathsConfig(root=str(tmp_path)))


def test_local_dir_and_lora(small_policy_cfg, tiny_dir, tmp_path):
    import dataclasses

    from abpo.policy.model import load_policy

    cfg = dataclasses.replace(
        small_policy_cfg, model=str(tiny_dir), lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"]
    )
    model, tok = load_policy(cfg, PathsConfig(root=str(tmp_path)), lora=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not model.training


def test_missing_model_is_a_clear_error(small_policy_cfg, tmp_path):
    import dataclasses

    from abpo.policy.model import ModelNotAvailableError, load_policy

    with pytest.raises(ModelNotAvailableError, match="gemma-3-4b-it"):
        load_policy(dataclasses.replace(small_policy_cfg, model="gpu"), PathsConfig(root=str(tmp_path)))
    with pytest.raises(ModelNotAvailableError, match="nothing is downloaded"):
        load_policy(
            dataclasses.replace(small_policy_cfg, model="no-such-org/no-such-model"), PathsConfig(root=str(tmp_path))
        )


@pytest.mark.slow
def test_smollm2_preset_converts_once_and_scores(small_policy_cfg, tmp_path):
    import dataclasses

    from abpo.policy.model import load_policy
    from abpo.policy.prompt import fit_prompt, format_answer
    from abpo.policy.scoring import score_candidates, score_candidates_naive

    torch.set_num_threads(2)
    paths = PathsConfig(root=str(tmp_path))
    model, tok = load_policy(dataclasses.replace(small_policy_cfg, model="smollm2-135m"), paths)
    assert (paths.resolve("models") / "smollm2-135m-instruct" / "config.json").exists()
    cands = [(1, "Toy Story (1995)"), (2, "Jumanji (1995)"), (3, "Heat (1995)")]
    fp = fit_prompt(tok, ["GoldenEye (1995)"], cands, max_history=5, max_prompt_tokens=2048)
    answers = [format_answer(i, t) for i, t in cands]
    s = score_candidates(model, tok, fp.text, answers, batch_tokens=4096)
    assert torch.allclose(s, score_candidates_naive(model, tok, fp.text, answers), atol=1e-4)
