"""The TRL internals ABPOTrainer wraps. If one of these fails after a TRL upgrade, the wrapper in
abpo/train/trainer.py must be re-checked against the new GRPOTrainer before the pin in pyproject.toml moves.

Pinned: trl>=1.16,<1.17. Relied on:
- GRPOTrainer._generate_and_score_completions(self, inputs) -> dict with "advantages" [N_local], "prompt_ids",
  "prompt_mask", "completion_ids", "completion_mask"; it calls self._calculate_rewards.
- GRPOTrainer._calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> rewards
  [N_global, n_funcs], gathered over processes, columns in reward_funcs order; reward functions get the dataset
  columns as keyword lists.
- the advantages are sliced per process as advantages[process_index * N_local : (process_index + 1) * N_local].
- RepeatSampler with shuffle=False keeps the dataset order and each prompt's num_generations rows adjacent.
- _compute_loss(self, model, inputs) is replaced whole by ABPOTrainer's (step 5 via abpo.algo.surrogate); it reads
  the keys TRL's generation batch carries (prompt_ids/mask, completion_ids/mask, advantages, old/ref log-probs)
  and TRL's self.epsilon_low/high, self.beta, self.temperature, self.current_gradient_accumulation_steps.
- self._metrics[mode][name] lists are averaged by GRPOTrainer.log; self.num_generations(_eval), self.eos_token_ids.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer


def test_trl_version_is_the_tested_range():
    v = Version(trl.__version__)
    assert Version("1.16") <= v < Version("1.17"), (
        f"trl {trl.__version__} is outside the tested range >=1.16,<1.17: re-run tests/train and review "
        "abpo/train/trainer.py against the new GRPOTrainer before widening the pin"
    )


@pytest.mark.parametrize(
    "name, params",
    [
        ("_generate_and_score_completions", ["self", "inputs"]),
        ("_calculate_rewards", ["self", "inputs", "prompts", "completions", "completion_ids_list"]),
        ("_compute_loss", ["self", "model", "inputs"]),
        ("_get_train_sampler", ["self", "dataset"]),
        ("_prepare_inputs", ["self", "generation_batch"]),
        (
            "_generate_single_turn",
            ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"],
        ),
        ("_get_per_token_logps_and_entropies", None),
        ("log", ["self", "logs", "start_time"]),
    ],
)
def test_wrapped_method_signatures(name, params):
    fn = getattr(GRPOTrainer, name, None)
    assert fn is not None, f"GRPOTrainer.{name} is gone (ABPOTrainer relies on it)"
    got = list(inspect.signature(fn).parameters)
    if params is None:  # ABPOTrainer passes the first four through by position, the rest by keyword
        params = ["self", "model", "input_ids", "attention_mask", "logits_to_keep"]
        got = got[: len(params)]
    assert got == params, f"GRPOTrainer.{name} signature changed"


def test_generate_and_score_source_contract():
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._calculate_rewards(" in src, "rewards are no longer computed through _calculate_rewards"
    for key in ('"advantages"', '"prompt_ids"', '"prompt_mask"', '"completion_ids"', '"completion_mask"'):
        assert key in src, f"output key {key} no longer built by _generate_and_score_completions"
    assert "advantages[process_slice]" in src and "self.accelerator.process_index * len(prompts)" in src, (
        "TRL changed how advantages are sliced per process"
    )
    rew = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "gather(rewards_per_func)" in rew, "_calculate_rewards no longer returns rewards gathered over processes"
    assert "reward_kwargs = {key: [example[key] for example in inputs]" in rew, (
        "dataset columns are no longer passed to reward functions as keyword lists"
    )
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'inputs["advantages"]' in loss, "_compute_loss no longer reads inputs['advantages']"


def test_fused_lm_head_and_generation_source_contract():
    """ABPOTrainer's two CPU savings rely on: (1) add_fused_lm_head deciding to gather the labelled positions with
    `trl.trainer.utils._use_triton(device)` (abpo.train.trainer._compact_fused_lm_head flips that decision);
    (2) HF generation calling the LM head module once per generated token (the self-certainty hook)."""
    import trl.trainer.utils as trl_utils

    assert callable(getattr(trl_utils, "_use_triton", None)), "trl.trainer.utils._use_triton is gone"
    src = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "compact = _use_triton(hidden_states.device)" in src, "TRL changed how the fused LM head picks positions"
    gen = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "unwrapped_model.generate(" in gen, "TRL's non-vLLM rollouts no longer go through HF generate"


def test_repeat_sampler_without_shuffle_keeps_order_and_groups():
    from trl.trainer.utils import RepeatSampler

    s = RepeatSampler(list(range(6)), mini_repeat_count=3, batch_size=2, repeat_count=1, shuffle=False, seed=0)
    assert list(s) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]


def _trainer(load_tiny, update_rows, tiny_update_cfg, tmp_path, variant="abpo"):
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.grpo_args import grpo_config
    from abpo.train.records import ABPOSettings
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(tiny_update_cfg, variant, output_dir=tmp_path / "ckpt", seed=0, disable_tqdm=True)
    return ABPOTrainer(
        model=model,
        args=args,
        settings=ABPOSettings(variant=variant, scoring_batch_tokens=4096),
        train_dataset=to_hf_dataset(update_rows),
        processing_class=tok,
    ), tok


def test_generate_and_score_output_and_loss(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """One real generation batch through TRL: the keys and shapes the wrapper uses, prompt tokens equal to the
    chat-rendered prompt the log was scored with, and TRL's grpo loss = minus the token-level clipped surrogate
    of abpo.algo (so the advantages we write are the ones the loss uses; in value every ratio level gives the same
    loss at s = 1, tests/train/test_fidelity.py checks the gradients)."""
    from abpo.algo.surrogate import clipped_surrogate
    from abpo.policy.prompt import encode_prompt, render_chat

    torch.manual_seed(0)
    trainer, tok = _trainer(load_tiny, update_rows, tiny_update_cfg, tmp_path)
    k = trainer.num_generations
    batch = [dict(r) for r in update_rows[:4] for _ in range(k)]
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    for key in ("advantages", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert key in out
    assert out["advantages"].shape == (len(batch),)
    assert trainer._abpo_rewards_per_func.shape == (len(batch), 2)
    for i, row in enumerate(batch):
        ids = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        assert ids == encode_prompt(tok, render_chat(tok, row["prompt"][0]["content"])), f"row {i}: prompt tokens"
    # the metrics dict the wrapper appends to
    assert "abpo/advantages/mean" in trainer._metrics["train"]

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop before each step
    loss = trainer._compute_loss(trainer.model, out)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, out["completion_ids"].size(1))
    expected = -clipped_surrogate(
        logp, logp.detach(), out["advantages"], out["completion_mask"], trainer.args.epsilon, ratio_level="token"
    )
    assert torch.allclose(loss, expected, atol=1e-5)
    # the compacted fused LM head (completion positions only) = TRL's own CPU path (every position projected)
    full, full_ent, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, trainer.model, ids, att, out["completion_ids"].size(1), compute_entropy=True
    )
    comp, comp_ent, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, att, out["completion_ids"].size(1), compute_entropy=True
    )
    m = out["completion_mask"].bool()
    assert torch.allclose(comp[m], full[m], atol=1e-5) and torch.allclose(comp_ent[m], full_ent[m], atol=1e-4)
