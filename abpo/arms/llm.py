"""LLM arms (``abpo``: variant F, ``grpo``: variant B): expose by sampling e_p(.|q) = softmax(s_p(a,q) / tau) over
the candidate set (ABPO_SPEC.md Eqs. s_p, e_p), with the shared-prefix scorer and the prompt builder that the
update uses for e_old (abpo.policy.scoring.score_examples), so the logged propensity is the e0 the next update
reads. ``logging_policy`` is ``softmax(tau=X)``: the update checks its tau against it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


class LLMArm:
    def __init__(self, name: str, model, tokenizer, titles: Mapping[int, str], policy_cfg, model_version: str):
        self.name = name
        self.model, self.tokenizer = model, tokenizer
        self.titles = titles
        self.policy = policy_cfg
        self.model_version = str(model_version)
        self.logging_policy = f"softmax(tau={policy_cfg.tau})"  # the rule abpo.policy.bandit writes

    @classmethod
    def from_dir(cls, name: str, model_dir: str | Path, cfg, dataset, model_version: str) -> LLMArm:
        from abpo.policy.model import load_policy

        model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(model_dir)), cfg.paths, dataset=dataset)
        model.eval()
        return cls(name, model, tok, dataset.titles(), cfg.policy, model_version)

    def propensities(self, requests: Sequence) -> list[np.ndarray]:
        from abpo.data.candidates import Example
        from abpo.policy.scoring import candidate_propensities, score_examples

        examples = [Example(f"{u}:{len(h)}", int(u), list(map(int, h)), list(map(int, c)), int(c[0]))
                    for u, h, c in requests]  # `positive` is not read when scoring
        scored = score_examples(self.model, self.tokenizer, examples, self.titles, self.policy)
        return [candidate_propensities(s.scores, self.policy.tau).double().numpy() for s in scored]
