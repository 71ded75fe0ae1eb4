"""The TRL reward functions of the trainer: r_fmt and r_match of docs/ABPO_SPEC.md step 2 over the rollouts'
completions (the tensor versions are abpo.algo.rewards); `REWARD_FUNCS` is their order, the columns of TRL's
rewards_per_func."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from abpo.algo.rewards import (
    chosen_items,
    format_reward as format_reward_tensor,
    match_reward as match_reward_tensor,
)

# TRL calls each with prompts, completions, completion_ids and every dataset column as keyword lists.


def _completion_texts(completions: Sequence[Any]) -> list[str]:
    """Conversational completions ([{"role": "assistant", "content": ...}]) or plain strings -> texts."""
    out = []
    for c in completions:
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list) and c and isinstance(c[-1], dict):
            out.append(str(c[-1].get("content") or ""))
        else:
            raise TypeError(f"abpo.train: unexpected completion type {type(c).__name__} from TRL")
    return out


def format_reward(prompts, completions, candidates, **kwargs) -> list[float]:
    """r_fmt per rollout (docs/ABPO_SPEC.md step 2) as a TRL reward function."""
    return format_reward_tensor(_completion_texts(completions), candidates).tolist()


def match_reward(prompts, completions, candidates, a_log, y, **kwargs) -> list[float]:
    """r_match per rollout (docs/ABPO_SPEC.md step 2: +1[a = a_log] if y = 1, -1[a = a_log] if y = 0) as a TRL
    reward function. Each row is one rollout, so a_log / y are broadcast per row ([N] with one column)."""
    chosen = chosen_items(_completion_texts(completions), candidates)  # [N], -1 for malformed
    logged = torch.tensor([int(a) for a in a_log], dtype=torch.int64)
    fb = torch.tensor([int(v) for v in y], dtype=torch.int64)
    return match_reward_tensor(chosen[:, None], logged, fb)[:, 0].tolist()


REWARD_FUNCS = [format_reward, match_reward]  # order = columns of rewards_per_func: 0 r_fmt, 1 r_match
