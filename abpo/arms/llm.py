"""LLMArm(variant): the LLM arms (``abpo``: variant F, ``grpo``: variant B). They expose by sampling
e_p(.|q) = softmax(s_p(a,q) / tau) over the candidate set (docs/ABPO_SPEC.md Eqs. s_p, e_p), with the shared-prefix
scorer and the prompt builder that the update uses for e_old (abpo.policy.scoring.score_examples), so the logged
propensity is the e0 the next update reads. ``logging_policy`` is ``softmax(tau=X)``: the update checks its tau
against it. A month refreshes an LLM arm by its variant's update from the champion (:meth:`LLMArm.refresh`).

HoldbackArm: the ``holdback`` arm, served like an LLM arm (pi_init's e_p, logged the same way) but never refreshed:
its champion stays pi_init every month, so the report's "updating vs not updating" comparison has a control."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from abpo import registry
from abpo.arms.base import Arm
from abpo.arms.names import HOLDBACK, LLM, entry
from abpo.data.candidates import Example
from abpo.months import Month
from abpo.policy.model import load_policy
from abpo.train.runs import UpdateRun

if TYPE_CHECKING:
    from abpo.config import Config


class LLMArm(Arm):
    kind: ClassVar[str] = LLM

    def __init__(
        self,
        name: str,
        model,
        tokenizer,
        titles: Mapping[int, str],
        policy_cfg,
        model_version: str,
        variant: str | None = None,
    ):
        self.name = name
        self.variant = variant
        self.model, self.tokenizer = model, tokenizer
        self.titles = titles
        self.policy = policy_cfg
        self.model_version = str(model_version)
        self.temperature = float(policy_cfg.tau)
        self.logging_policy = f"softmax(tau={policy_cfg.tau})"  # the rule abpo.policy.bandit writes

    @classmethod
    def temperature_of(cls, name: str, cfg: Config) -> float:
        return float(cfg.policy.tau)

    @classmethod
    def from_dir(
        cls, name: str, model_dir: str | Path, cfg: Config, dataset, model_version: str, variant: str | None = None
    ) -> LLMArm:

        model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(model_dir)), cfg.paths, dataset=dataset)
        model.eval()
        return cls(name, model, tok, dataset.titles(), cfg.policy, model_version, variant=variant)

    @classmethod
    def load(cls, name: str, path: str | Path, cfg: Config, *, dataset, model_version: str) -> LLMArm:
        return cls.from_dir(name, path, cfg, dataset, model_version, variant=entry(name).refreshed_by)

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        return out

    @classmethod
    def log_model(cls, cfg: Config, local_dir: str | Path) -> str:

        return registry.log_model_dir(local_dir, policy_cfg=cfg.policy)

    @classmethod
    def missing_files(cls, path: str | Path) -> list[str]:
        """A save_pretrained directory's config.json and weights (abpo.registry.missing_pretrained_files)."""
        return registry.missing_pretrained_files(path)

    @classmethod
    def refresh(
        cls,
        name: str,
        cfg: Config,
        *,
        month: Month,
        parent_dir: Path,
        months: Sequence[str],
        strata,
        run_tags: dict[str, str],
    ) -> Any:
        """The arm's variant, trained from ``parent_dir`` (its champion) on ``strata`` (positive, no-response: its
        own logs of ``months``), saved under ``models/arms/<arm>/<month>``; returns abpo.train.update's result.
        Every month starts afresh from the champion (no resume) and keeps the merged model, which serving loads;
        ``arms.update_max_examples`` (or the arm's ``arms.update_max_examples_by_arm``) caps the rows, and the arm's
        ``arms.update_by_arm`` entry sets its budget over section update's (learning rate, epochs, schedule)."""
        from abpo.train.update import run_update

        u = dataclasses.replace(cfg.arms.update_settings(name, cfg.update), resume=False, save_merged=True)
        run = UpdateRun(
            variant=entry(name).refreshed_by,
            arm=name,
            months=tuple(months),
            init_model=parent_dir,
            output=Path("arms") / name / month,
        )
        return run_update(dataclasses.replace(cfg, update=u), run, progress=False, strata=strata, run_tags=run_tags)

    def propensities(self, requests: Sequence) -> list[np.ndarray]:
        return self.propensities_at(requests, [self.policy.tau])[self.policy.tau]

    def propensities_at(self, requests: Sequence, taus: Sequence[float]) -> dict[float, list[np.ndarray]]:
        """Eq. e_p, softmax(s_p / tau) per request (user, history, candidates), at every tau of ``taus`` from one
        scoring pass (benchmarks/budget_curve.py scores its cells at several exposure temperatures)."""
        from abpo.policy.scoring import candidate_propensities, score_examples

        examples = [
            Example(f"{u}:{len(h)}", int(u), list(map(int, h)), list(map(int, c)), int(c[0])) for u, h, c in requests
        ]  # `positive` is not read when scoring
        scored = score_examples(self.model, self.tokenizer, examples, self.titles, self.policy)
        return {t: [candidate_propensities(s.scores, t).double().numpy() for s in scored] for t in taus}


class HoldbackArm(LLMArm):
    """The holdback: pi_init served as an LLM arm, never updated, never promoted (abpo.monthly.hold records why its
    month does nothing and checks its champion is still pi_init)."""

    kind: ClassVar[str] = HOLDBACK

    @classmethod
    def refresh(cls, name: str, cfg: Config, **inputs: Any) -> Any:
        raise RuntimeError(
            f"arm {name}: a holdback arm is never refreshed; rule: its champion stays pi_init (abpo.monthly.hold)"
        )
