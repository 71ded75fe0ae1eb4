"""The MLflow pyfunc loader for a registered policy checkpoint (``loader_module`` of
:func:`abpo.registry.log_model_dir`): ``mlflow.pyfunc.load_model("models:/abpo-recommender@champion")``
gives a recommender that ranks a request's candidate set by s_p(a,q) and returns e_p(a|q), with the prompt builder
and the s_p (item token or answer mean, per ``policy.prompt_style``) the policy was trained and logged with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def load_checkpoint(path: str | Path):
    """(model, tokenizer) from a save_pretrained directory: a full model, or a LoRA adapter whose
    ``base_model_name_or_path`` is a local directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if (path / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model.eval()
    return model, tokenizer


class RecommenderModel:
    """Input rows: ``history_titles`` (list of str, chronological), ``candidate_ids`` (list of int),
    ``candidate_titles`` (list of str), and ``history_item_ids`` (list of int, aligned with the titles; required
    when the policy was trained with ``policy.history_item_ids``). Output rows: ``ranked_item_ids`` (best first) and
    ``propensities`` (e_p(a|q) in the order of ``candidate_ids``, docs/ABPO_SPEC.md "Propensities"). Param ``tau``
    (default: the logged policy's) is the propensities' temperature (abpo.registry.llm_signature declares it)."""

    def __init__(self, path: str | Path, policy_cfg=None):
        from abpo.config.policy import PolicyConfig

        self.model, self.tokenizer = load_checkpoint(path)
        self.policy = policy_cfg or PolicyConfig()

    def predict(self, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from abpo.policy.prompt import encode_answer, encode_prompt, format_answer, prompt_style, request_prompt
        from abpo.policy.scoring import candidate_propensities, score_prompt_ids, scores_on_choice

        tau = float((params or {}).get("tau", self.policy.tau))
        ranked, props = [], []
        for i, row in enumerate(model_input.itertuples(index=False)):
            # lists, or numpy arrays when MLflow enforced the signature's Array columns
            ids, titles = [int(x) for x in row.candidate_ids], [str(t) for t in row.candidate_titles]
            if len(ids) != len(titles) or not ids:
                raise ValueError(f"row {i}: candidate_ids and candidate_titles must be non-empty and of equal length")
            hist_titles = [str(t) for t in row.history_titles]
            raw_ids = getattr(row, "history_item_ids", None)
            hist_ids = (
                []
                if raw_ids is None or (not hasattr(raw_ids, "__len__") and pd.isna(raw_ids))
                else [int(x) for x in raw_ids]
            )
            needs_ids = self.policy.history_item_ids or prompt_style(self.policy) == "item_tokens"
            if needs_ids and len(hist_ids) != len(hist_titles):
                raise ValueError(
                    f"row {i}: history_item_ids has {len(hist_ids)} ids for {len(hist_titles)} history titles; rule: "
                    "this policy's prompts show the history's ids (policy.history_item_ids or "
                    "policy.prompt_style=item_tokens)"
                )
            hist = list(zip(hist_ids, hist_titles)) if hist_ids else [(-1, t) for t in hist_titles]
            # the same prompt builder the policy was trained and logged with: chat template, token budget
            prompt = request_prompt(self.tokenizer, hist, list(zip(ids, titles)), self.policy).text
            answer_ids = (
                None
                if scores_on_choice(self.policy)
                else [[encode_answer(self.tokenizer, format_answer(a, t)) for a, t in zip(ids, titles)]]
            )
            scores = score_prompt_ids(
                self.model, self.tokenizer, [encode_prompt(self.tokenizer, prompt)], [ids], answer_ids, self.policy
            )[0]
            e = candidate_propensities(scores, tau)
            order = scores.argsort(descending=True).tolist()
            ranked.append([ids[j] for j in order])
            props.append(e.tolist())
        return pd.DataFrame({"ranked_item_ids": ranked, "propensities": props})


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> RecommenderModel:
    """MLflow's loader_module hook: ``data_path`` is the logged checkpoint directory, ``model_config`` the
    `policy` config section it was logged with (see :func:`abpo.registry.log_model_dir`)."""
    from abpo.config.policy import PolicyConfig

    known = {f for f in PolicyConfig.__dataclass_fields__}
    policy = PolicyConfig(**{k: v for k, v in (model_config or {}).items() if k in known})
    return RecommenderModel(data_path, policy)
