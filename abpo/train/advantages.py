"""Steps 2-4 of docs/ABPO_SPEC.md "The update" for one generation batch: the rewards (step 2, with r_sc), the SNIPS
weight of the anchor (step 3, with e_old under the current policy) and the variant's advantages (step 4), with the
step's metrics, plus the logged items' own terms of docs/update-variants.md (Eqs. L1, O1, O3).

Two halves, each a function of what it is given:

- per process: :class:`PolicyScorer` (e_old and r_sc under the current policy) and :func:`local_records` (one
  :class:`~abpo.train.records.RolloutRecord` per rollout of this process);
- over the gathered batch: :func:`batch_advantages` (groups -> rewards -> SNIPS weights -> advantages -> metrics),
  whose named steps cite the spec's equations.

`ABPOTrainer` (abpo.train.trainer) holds the scorer and calls both from its TRL override."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from abpo.algo.anchor_terms import anchor_advantage, likelihood_coefficients
from abpo.algo.rewards import (
    anchor_reward,
    self_certainty,
    simulated_click_reward,
    token_kl_from_uniform,
    total_reward,
)
from abpo.algo.snips import effective_sample_size, snips_weight, stratified_self_normalise
from abpo.algo.stratum_weight import no_response_abs_share, stratum_weighted_advantages
from abpo.algo.variants import Variant, anchor_weights, rollout_advantages
from abpo.policy.scoring import candidate_propensities, score_prompt_ids, scores_on_choice
from abpo.policy.token_scoring import PromptLogits
from abpo.train.answers import AnswerTokens, AnswerTries
from abpo.train.diagnostics import step_diagnostics
from abpo.train.records import ABPOSettings, CandidateSet, RolloutRecord

# the logged items' own terms of a generation batch, per gathered row [B * K]: (c_ll, c_off, log e0)
AnchorCoefficients = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# ------------------------------------------------------------------------------------- per process: the policy's view


class PolicyScorer:
    """e_old and r_sc under the current policy: ``policy()`` gives the unwrapped model at the time of the call (the
    rollout policy pi_old = pi_theta of this step), scored with ``settings`` (tau, prompt_style,
    scoring_batch_tokens) through ``tokenizer`` on ``accelerator``'s device, ``batch_size`` rows per forward."""

    def __init__(
        self,
        policy: Callable[[], Any],
        settings: ABPOSettings,
        tokenizer: Any,
        accelerator: Any,
        answers: AnswerTokens,
        tries: AnswerTries,
        *,
        batch_size: int,
    ):
        self.policy = policy
        self.settings = settings
        self.tokenizer = tokenizer
        self.accelerator = accelerator
        self.answers = answers
        self.tries = tries
        self.batch_size = max(1, batch_size)

    @torch.no_grad()
    def e_old_dists(self, items: Sequence[CandidateSet], logits: PromptLogits | None = None) -> list[torch.Tensor]:
        """e_old(. | q) = softmax_C(s_old / tau) over each example's whole candidate set C (docs/ABPO_SPEC.md
        "Propensities"), [|C|] per (prompt ids, candidate answers, candidates), in the candidates' order: the SNIPS
        weight's numerator (step 3) and pi of the diagnostics' Eq. G (abpo.algo.diagnostics). Scored by the policy
        helper's batched scorer (``score_prompt_ids``) with the s_p e0 was logged with: the item token's log-prob,
        or the mean over each answer's (cached) token ids. ``logits``: the prompts' next-token logits under the
        current policy (the single-choice rollouts' of this generation batch), which the item-token score reads
        instead of running the prompts again."""
        if not items:
            return []
        st = self.settings
        answer_ids = None if scores_on_choice(st) else [[self.answers.ids(a) for a in c.answers] for c in items]
        scores = score_prompt_ids(
            self.policy(),
            self.tokenizer,
            [c.prompt_ids for c in items],
            [list(c.candidates) for c in items],
            answer_ids,
            st,
            logits=logits,
        )
        return [candidate_propensities(s, st.tau).detach().cpu() for s in scores]

    @torch.no_grad()
    def e_old(self, items: Sequence[tuple[CandidateSet, int]]) -> list[float]:
        """e_old(a_log | q) of step 3 for every (candidate set, a_log) (:meth:`e_old_dists` at a_log)."""
        dists = self.e_old_dists([cset for cset, _ in items])
        return [float(e[list(cset.candidates).index(a_log)]) for e, (cset, a_log) in zip(dists, items, strict=True)]

    @torch.no_grad()
    def self_certainty(
        self,
        pairs: list[tuple[list[int], list[int]]],
        rows: Sequence[dict] | None = None,
        logits: PromptLogits | None = None,
    ) -> list[float]:
        """r_sc = mean over the positions t of update.self_certainty_positions of KL(U || pi_theta(. | q, a_<t))
        (docs/ABPO_SPEC.md step 2) of each (prompt ids, completion ids) under the current policy, in chunks of
        ``batch_size``.

        The spec averages over all T tokens of the completion (``answer``). By default (``choice``) only the tokens
        that carry a choice count (``AnswerTrie.choice_mask`` of the row's candidate set, ``rows[i]``; see
        `AnswerTries.sc_mask`): the tokens forced by the chosen item (for item-token models, everything after the
        item token; for text models, the title once the id is fixed) would measure how confidently the model copies
        a title, which says nothing about the choice. For an item-token model r_sc is then KL(U || pi_theta(.|q)) at
        the item token, the same for every rollout of a group. Without ``rows`` every token counts.
        Prompts are left-padded and completions right-padded, with position ids from the attention mask (padding
        changes no position). ``logits``: prompts' next-token logits under the current policy (the single-choice
        rollouts' of this generation batch); a pair whose positions are its first token alone is then
        KL(U || pi_theta(. | q)) read from its prompt's row, without a forward (:meth:`_at_prompt`)."""
        if not pairs:
            return []
        out: list[float | None] = self._at_prompt(pairs, rows, logits)
        todo = [i for i, v in enumerate(out) if v is None]
        if not todo:
            return [float(v) for v in out if v is not None]
        model = self.policy()
        was_training = model.training
        model.eval()
        try:
            for s in range(0, len(todo), self.batch_size):
                part = todo[s : s + self.batch_size]
                vals = self._chunk_self_certainty(
                    model, [pairs[i] for i in part], [rows[i] for i in part] if rows is not None else None
                )
                for i, v in zip(part, vals, strict=True):
                    out[i] = v
        finally:
            model.train(was_training)
        return [float(v) for v in out if v is not None]

    def _at_prompt(self, pairs, rows, logits: PromptLogits | None) -> list[float | None]:
        """r_sc of the pairs whose averaged positions are the first completion token alone (update.self_certainty_
        positions = choice with one token per item id), KL(U || pi_theta(. | q)) (Eq. of docs/ABPO_SPEC.md step 2
        over one position) from their prompt's row of ``logits``; None for the others (they need a forward)."""
        out: list[float | None] = [None] * len(pairs)
        if logits is None:
            return out
        at_prompt = []
        for i, (p, c) in enumerate(pairs):
            mask = self.tries.sc_mask(rows[i], c) if rows is not None else [1] * len(c)
            if c and mask[0] == 1 and not any(mask[1:]) and logits.covers([p]):
                at_prompt.append(i)
        if at_prompt:
            kl = token_kl_from_uniform(logits.logits[logits.rows([pairs[i][0] for i in at_prompt])])
            for i, v in zip(at_prompt, kl.tolist(), strict=True):
                out[i] = v
        return out

    def _chunk_self_certainty(self, model, part, rows) -> list[float]:
        """r_sc of one chunk of (prompt ids, completion ids), padded into one forward pass."""
        device = self.accelerator.device
        pad = self.tokenizer.pad_token_id
        P = max(len(p) for p, _ in part)
        C = max(max(len(c) for _, c in part), 1)
        ids = torch.full((len(part), P + C), pad, dtype=torch.long)
        attn = torch.zeros((len(part), P + C), dtype=torch.long)
        cmask = torch.zeros((len(part), C), dtype=torch.long)
        for r, (p, c) in enumerate(part):
            ids[r, P - len(p) : P] = torch.tensor(p)
            attn[r, P - len(p) : P] = 1
            if c:
                ids[r, P : P + len(c)] = torch.tensor(c)
                attn[r, P : P + len(c)] = 1
                row = rows[r] if rows is not None else None
                cm = self.tries.sc_mask(row, c) if row is not None else [1] * len(c)
                cmask[r, : len(c)] = torch.tensor(cm, dtype=torch.long)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with self.accelerator.autocast():
            logits = model(
                input_ids=ids.to(device),
                attention_mask=attn.to(device),
                position_ids=pos.to(device),
                logits_to_keep=C + 1,
                use_cache=False,
            ).logits
        # logits[:, t] predicts completion token t (positions P-1 .. P+C-2)
        return self_certainty(logits[:, :C].float(), cmask.to(device)).cpu().tolist()


# ------------------------------------------------------------------------------------- per process: the records


@dataclass
class LocalBatch:
    """This process's rows of a generation batch as the records need them: the dataset rows, their prompt and
    completion ids without padding, and the feedback y of each."""

    inputs: list[dict]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    y: list[int]

    @classmethod
    def of(cls, inputs, output) -> LocalBatch:
        def unpadded(ids, mask):
            return [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]

        return cls(
            list(inputs),
            unpadded(output["prompt_ids"], output["prompt_mask"]),
            unpadded(output["completion_ids"], output["completion_mask"]),
            [int(x["y"]) for x in inputs],
        )

    def first_rows(self) -> dict[str, int]:
        """request id -> the first of its rows here (a logged example's terms are computed once per process)."""
        first: dict[str, int] = {}
        for i, x in enumerate(self.inputs):
            first.setdefault(str(x["request_id"]), i)
        return first


def local_records(
    batch: LocalBatch,
    variant: Variant,
    settings: ABPOSettings,
    scorer: PolicyScorer,
    *,
    chosen: list[int] | None,
    recorded_sc: list[float] | None,
    item_popularity: dict[int, int] | None,
    prompt_logits: PromptLogits | None = None,
) -> list[RolloutRecord]:
    """One RolloutRecord per rollout of this process: its feedback and e0, its r_sc (step 2), e_old(a_log | q) and
    e_old(. | q) of its logged example (step 3), the anchor's r_sc, the candidate it chose (``chosen``, as the reward
    functions parsed it) and what the diagnostics need. ``recorded_sc``: r_sc of the rollouts recorded during
    generation (abpo.train.rollouts), else a forward pass computes it. ``prompt_logits``: the prompts' next-token
    logits the single-choice rollouts were drawn from, under this same policy pi_old (no optimizer step between the
    rollouts and the advantages): e_old on the item token and the anchors' r_sc at the choice read them."""
    n_local = len(batch.inputs)
    if chosen is None or len(chosen) != n_local:
        raise RuntimeError(
            "ABPOTrainer: the rollouts' chosen candidates were not recorded by _calculate_rewards; the TRL "
            "internals changed (see tests/train/test_trl_contract.py)"
        )
    r_sc = rollout_self_certainty(batch, variant, scorer, recorded_sc)
    first = batch.first_rows()
    pi, e_old = example_propensities(batch, first, scorer, prompt_logits)
    anchor_sc = anchor_self_certainty(batch, first, variant, scorer, prompt_logits)
    popularity, title_tokens = chosen_item_traits(batch, variant, chosen, scorer.answers, item_popularity)
    sim = simulated_clicks(batch, chosen) if settings.reward == "simulated_click" else [math.nan] * n_local
    records = []
    for i, x in enumerate(batch.inputs):
        rid = str(x["request_id"])
        records.append(
            RolloutRecord(
                request_id=rid,
                y=batch.y[i],
                e0=float(x["e0"]),
                r_sc=r_sc[i],
                e_old=e_old.get(rid, math.nan),
                anchor_sc=anchor_sc.get(rid, 0.0),
                chosen=chosen[i],
                pi=pi[rid].tolist() if first[rid] == i else None,
                a_log_index=list(x["candidates"]).index(int(x["a_log"])),
                popularity=popularity[i],
                title_tokens=title_tokens[i],
                sim_click=sim[i],
            )
        )
    return records


def rollout_self_certainty(
    batch: LocalBatch, variant: Variant, scorer: PolicyScorer, recorded: list[float] | None
) -> list[float]:
    """Step 2's r_sc of the rollouts of no-response rows (0 elsewhere: it never enters their reward), from the
    generation logits when ``recorded`` (HF generate), else a forward pass."""
    n_local = len(batch.inputs)
    r_sc = [0.0] * n_local
    if not variant.self_certainty:
        return r_sc
    rows = [i for i in range(n_local) if batch.y[i] == 0]
    if recorded is not None and len(recorded) == n_local:
        vals = [recorded[i] for i in rows]
    else:
        pairs = [(batch.prompt_ids[i], batch.completion_ids[i]) for i in rows]
        vals = scorer.self_certainty(pairs, [batch.inputs[i] for i in rows])
    for i, val in zip(rows, vals):
        r_sc[i] = val
    return r_sc


def example_propensities(
    batch: LocalBatch, first: dict[str, int], scorer: PolicyScorer, prompt_logits: PromptLogits | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(e_old(. | q) over C, e_old(a_log | q)) of every logged example, by request id: the SNIPS weight's numerator
    (step 3) of D and F, and the diagnostics of every variant (B included); the item-token score reads
    ``prompt_logits`` (the rollouts' logits under pi_old) when given."""
    todo = list(first.items())
    x = batch.inputs
    dists = scorer.e_old_dists(
        [CandidateSet(batch.prompt_ids[i], x[i]["candidate_answers"], x[i]["candidates"]) for _, i in todo],
        prompt_logits,
    )
    pi = {rid: d for (rid, _), d in zip(todo, dists)}
    e_old = {rid: float(d[list(x[i]["candidates"]).index(int(x[i]["a_log"]))]) for (rid, i), d in zip(todo, dists)}
    return pi, e_old


def anchor_self_certainty(
    batch: LocalBatch,
    first: dict[str, int],
    variant: Variant,
    scorer: PolicyScorer,
    prompt_logits: PromptLogits | None = None,
) -> dict[str, float]:
    """r_sc of the anchor (the logged item's answer + EOS, what SFT appends after an answer) of every no-response
    logged example, by request id (step 2, last bullet); empty unless the variant has both. At the choice position
    of a single-choice answer it is KL(U || pi_old(. | q)), read from ``prompt_logits`` when given."""
    if not (variant.anchor and variant.self_certainty):
        return {}
    eos = scorer.tokenizer.eos_token_id
    todo = [(rid, i) for rid, i in first.items() if batch.y[i] == 0]
    pairs = [(batch.prompt_ids[i], scorer.answers.ids(batch.inputs[i]["anchor_text"]) + [eos]) for _, i in todo]
    vals = scorer.self_certainty(pairs, [batch.inputs[i] for _, i in todo], prompt_logits)
    return {rid: val for (rid, _), val in zip(todo, vals)}


def chosen_item_traits(
    batch: LocalBatch,
    variant: Variant,
    chosen: list[int],
    answers: AnswerTokens,
    item_popularity: dict[int, int] | None,
) -> tuple[list[float], list[float]]:
    """The popularity and title tokens of the item each scored rollout (y = 0, well formed) chose, NaN for the
    others: the diagnostics' r_sc correlations."""
    n_local = len(batch.inputs)
    popularity, title_tokens = [math.nan] * n_local, [math.nan] * n_local
    if not variant.self_certainty:
        return popularity, title_tokens
    for i, x in enumerate(batch.inputs):
        if batch.y[i] == 0 and chosen[i] >= 0:
            item = int(x["candidates"][chosen[i]])
            popularity[i] = float(item_popularity.get(item, 0)) if item_popularity is not None else math.nan
            title_tokens[i] = float(answers.title_tokens(x["candidate_answers"][chosen[i]]))
    return popularity, title_tokens


def simulated_clicks(batch: LocalBatch, chosen: list[int]) -> list[float]:
    """The simulator's reward of each rollout (settings.reward = simulated_click: the online upper bound;
    abpo.algo.rewards.simulated_click_reward)."""
    out = []
    for i, x in enumerate(batch.inputs):
        p_click = torch.tensor([list(x["candidate_click_prob"])], dtype=torch.float64)
        out.append(float(simulated_click_reward(torch.tensor([[chosen[i]]]), p_click)[0, 0]))
    return out


# ------------------------------------------------------------------------------------- the gathered batch


@dataclass
class BatchAdvantages:
    """What :func:`batch_advantages` gives: the advantages [B, K] of every gathered rollout, the step's metrics and,
    when an anchor term is on, the logged items' coefficients."""

    advantages: torch.Tensor
    metrics: dict[str, float]
    anchor_coefs: AnchorCoefficients | None


def batch_advantages(
    variant: Variant,
    settings: ABPOSettings,
    records: list[RolloutRecord],
    rewards_per_func: torch.Tensor,
    k: int,
    *,
    training: bool,
    global_step: int,
    sc_trace: dict[str, list[float]],
    with_popularity: bool,
) -> BatchAdvantages:
    """Steps 2-4 over every process's ``records`` (TRL's gather order, ``rewards_per_func``'s: [N, 2] of r_fmt,
    r_match), ``k`` rollouts per logged example."""
    groups = group_records(records, rewards_per_func, k)
    y = torch.tensor([grp[0].y for grp in groups], dtype=torch.int64)  # [B]
    if training:
        check_both_strata(y, global_step)
    r_fmt, r_match, r_sc, r_roll, metrics = rollout_rewards(variant, settings, records, rewards_per_func, y, k)
    r_log, w = anchor_reward_and_weight(variant, settings, groups, y, metrics)
    adv = rollout_advantages(variant, r_log, r_roll, y, w, delta=settings.delta, eps_std=settings.eps_std)  # step 4
    kappa = settings.no_response_kappa()
    adv = stratum_weighted_advantages(adv, y, kappa, settings.click_weight)  # Eq. N1 of docs/update-variants.md
    if kappa != 1.0 or settings.no_response_weight_rule != "fixed":
        metrics["abpo/no_response_weight"] = kappa
        if settings.click_rate is not None:
            metrics["abpo/no_response_weight_click_rate"] = float(settings.click_rate)
    coefs = anchor_coefficients(variant, settings, groups, y, r_roll, kappa, metrics) if settings.anchor_terms else None
    metrics.update(advantage_metrics(y, r_fmt, r_match, r_roll, r_sc, adv))
    metrics.update(
        step_diagnostics(
            variant,
            settings,
            groups,
            y,
            r_match,
            r_fmt,
            r_roll,
            r_sc,
            adv,
            sc_trace=sc_trace,
            training=training,
            with_popularity=with_popularity,
        )
    )
    return BatchAdvantages(adv, metrics, coefs)


def group_records(records: list[RolloutRecord], rewards_per_func: torch.Tensor, k: int) -> list[list[RolloutRecord]]:
    """The gathered records cut into groups of ``k`` rollouts of one logged example each (TRL's sampler keeps them
    together); RuntimeError when the counts or a group's examples say the TRL internals changed."""
    n = len(records)
    if rewards_per_func.shape[0] != n or n % k:
        raise RuntimeError(
            f"ABPOTrainer: {rewards_per_func.shape[0]} gathered rewards for {n} gathered rows, group size {k}; "
            "the TRL internals changed (see tests/train/test_trl_contract.py)"
        )
    groups = [records[g * k : (g + 1) * k] for g in range(n // k)]
    for g, grp in enumerate(groups):
        if len({r.request_id for r in grp}) != 1:
            raise RuntimeError(
                f"ABPOTrainer: group {g} of the generation batch mixes logged examples "
                f"{sorted({r.request_id for r in grp})}; "
                "rule: TRL's sampler keeps one example's num_generations rollouts together"
            )
    return groups


def check_both_strata(y: torch.Tensor, global_step: int) -> None:
    """Step 3's precondition: every SNIPS mini-batch (one generation batch) holds positive and no-response rows."""
    if not ((y == 1).any() and (y == 0).any()):
        raise RuntimeError(
            f"ABPOTrainer: the generation batch of optimizer step {global_step + 1} holds only y = "
            f"{int(y[0])} rows; rule: every SNIPS mini-batch holds both positive and no-response rows "
            "(docs/ABPO_SPEC.md "
            "step 3: w_hat is self-normalised inside B_1 and B_0). The batches of abpo.train.dataset are built "
            "so; a batch without one stratum means the dataset was not built by update_dataset_from_strata"
        )


def rollout_rewards(
    variant: Variant,
    settings: ABPOSettings,
    records: list[RolloutRecord],
    rewards_per_func: torch.Tensor,
    y: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Step 2 for the gathered rollouts, ``k`` per logged example, [B, K] each: (r_fmt, r_match, r_sc or None,
    r = r_match + r_fmt (+ lambda_sc r_sc for y = 0), metrics). With settings.reward = simulated_click, r_sim
    replaces r_match (abpo.algo.rewards.simulated_click_reward)."""
    b = len(records) // k
    rpf = rewards_per_func.detach().float().cpu()
    r_fmt = rpf[:, 0].view(b, k)
    r_match = rpf[:, 1].view(b, k)
    metrics: dict[str, float] = {}
    if settings.reward == "simulated_click":
        r_match = torch.tensor([r.sim_click for r in records], dtype=torch.float32).view(b, k)
        metrics["abpo/reward/simulated_click_mean"] = float(r_match.mean())
    lam = variant.effective_lambda_sc(settings.lambda_sc)
    r_sc = torch.tensor([r.r_sc for r in records], dtype=torch.float32).view(b, k) if variant.self_certainty else None
    r_roll = total_reward(r_match, r_fmt, r_sc, y, lam)  # [B, K] step 2
    return r_fmt, r_match, r_sc, r_roll, metrics


def anchor_reward_and_weight(
    variant: Variant, settings: ABPOSettings, groups: list[list[RolloutRecord]], y: torch.Tensor, metrics: dict
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(r_log, w) of every logged example, [B] each, None where the variant has no anchor / no SNIPS weight:
    r_log = the anchor's reward (step 2, last bullet); w = e_old(a_log | q) / e0(a_log | q) (step 3, capped by
    update.w_max), its summary added to ``metrics``."""
    if not variant.anchor:
        return None, None
    lam = variant.effective_lambda_sc(settings.lambda_sc)
    sc_log = torch.tensor([grp[0].anchor_sc for grp in groups], dtype=torch.float32) if variant.self_certainty else None
    r_log = anchor_reward(y, sc_log, lam)  # [B] step 2, last bullet
    metrics["abpo/reward/anchor_mean"] = r_log.mean().item()
    if not variant.snips:
        return r_log, None
    w = snips_weights(settings, groups, y, metrics)
    return r_log, w.float()


def snips_weights(settings: ABPOSettings, groups: list[list[RolloutRecord]], y: torch.Tensor, metrics: dict):
    """Step 3: w = e_old(a_log | q) / e0(a_log | q) per logged example (float64, capped by update.w_max when set), and
    its summary in ``metrics`` (w_hat: the stratified self-normalisation inside B_1 and B_0, `update.delta`)."""
    b = len(groups)
    e0 = torch.tensor([grp[0].e0 for grp in groups], dtype=torch.float64)
    e_old = torch.tensor([grp[0].e_old for grp in groups], dtype=torch.float64)
    if torch.isnan(e_old).any():
        raise RuntimeError("ABPOTrainer: e_old missing for a logged example after the gather")
    w = snips_weight(e_old, e0)  # step 3: w = e_old / e0
    if settings.w_max > 0:
        w = w.clamp(max=settings.w_max)
    w_hat = stratified_self_normalise(w, y, settings.delta)
    metrics.update(
        {
            "abpo/snips/w_mean": w.mean().item(),
            "abpo/snips/w_max": w.max().item(),
            "abpo/snips/w_hat_max": w_hat.max().item(),
            "abpo/snips/ess": effective_sample_size(w).item(),
            "abpo/snips/ess_fraction": effective_sample_size(w).item() / b,
            "abpo/snips/e_old_mean": e_old.mean().item(),
            "abpo/snips/e0_mean": e0.mean().item(),
        }
    )
    for stratum, name in ((1, "positive"), (0, "no_response")):
        if (y == stratum).any():
            metrics[f"abpo/snips/ess_{name}"] = effective_sample_size(w[y == stratum]).item()
    return w


def advantage_metrics(
    y: torch.Tensor,
    r_fmt: torch.Tensor,
    r_match: torch.Tensor,
    r_roll: torch.Tensor,
    r_sc: torch.Tensor | None,
    adv: torch.Tensor,
) -> dict[str, float]:
    """The step's reward components, match rates per stratum and advantage statistics (docs/ABPO_SPEC.md
    "Metrics", docs/diagnostics.md)."""
    b, k = r_roll.shape
    pos = (y == 1)[:, None].expand(b, k)
    neg = ~pos
    hit_pos = (r_match == 1.0) & pos
    hit_neg = (r_match == -1.0) & neg
    metrics = {
        "abpo/rollouts/well_formed": (r_fmt == 1.0).float().mean().item(),
        "abpo/reward/total_mean": r_roll.mean().item(),
        "abpo/reward/format_mean": r_fmt.mean().item(),
        "abpo/reward/match_mean": r_match.mean().item(),
        "abpo/batch/positive_examples": float((y == 1).sum()),
        "abpo/batch/no_response_examples": float((y == 0).sum()),
        "abpo/advantages/mean": adv.mean().item(),
        "abpo/advantages/std": adv.std(unbiased=False).item(),
        "abpo/advantages/min": adv.min().item(),
        "abpo/advantages/max": adv.max().item(),
        "abpo/advantages/abs_mean": adv.abs().mean().item(),
        # how much of the step's push the no-response rows carry (after kappa)
        "abpo/advantages/no_response_abs_share": no_response_abs_share(adv, y),
    }
    if pos.any():
        metrics["abpo/match_rate/positive"] = (hit_pos.sum() / pos.sum()).item()
    if neg.any():
        metrics["abpo/match_rate/no_response"] = (hit_neg.sum() / neg.sum()).item()
    if r_sc is not None and neg.any():
        metrics["abpo/reward/self_certainty_mean"] = r_sc[neg].mean().item()
    return metrics


# ------------------------------------------------------------------------------------- the logged items' own terms


def anchor_coefficients(
    variant: Variant,
    settings: ABPOSettings,
    groups: list[list[RolloutRecord]],
    y: torch.Tensor,
    r_roll: torch.Tensor,
    kappa: float,
    metrics: dict,
) -> AnchorCoefficients:
    """The logged items' own terms of the generation batch (docs/update-variants.md), as per-row tensors over
    the gathered rows [B * K] (each logged example's coefficient on the first of its K rows, 0 on the others, so
    that the loss scores each anchor once): c_ll = lambda_ll y w_hat / B (Eq. L1), c_off = lambda_off nu_y
    A^log / B (Eqs. O1, O3) and log e0(a^log | q). w = e_old / e0 as step 3 (capped by update.w_max); A^log
    under the variant's baseline and spread (B: the rollouts' plain mean and spread)."""
    v, st = variant, settings
    b, k = r_roll.shape
    e0 = torch.tensor([g[0].e0 for g in groups], dtype=torch.float64)
    e_old = torch.tensor([g[0].e_old for g in groups], dtype=torch.float64)
    if torch.isnan(e_old).any():
        raise RuntimeError("ABPOTrainer: e_old missing for a logged example after the gather")
    w = snips_weight(e_old, e0)
    if st.w_max > 0:
        w = w.clamp(max=st.w_max)
    ll = torch.zeros(b)
    off = torch.zeros(b)
    if st.likelihood_weight > 0:
        ll = likelihood_coefficients(w, y, st.delta, st.likelihood_weight)  # Eq. L1
        metrics["abpo/likelihood/coef_sum"] = float(ll.sum())
    if st.offpolicy_weight > 0:
        lam = v.effective_lambda_sc(st.lambda_sc)
        sc_log = torch.tensor([g[0].anchor_sc for g in groups], dtype=torch.float32) if v.self_certainty else None
        r_log = anchor_reward(y, sc_log, lam)
        w_hat = anchor_weights(v, w.float(), y, st.delta) if v.anchor else None
        a_log = anchor_advantage(r_log.float(), r_roll.float(), w_hat, st.eps_std)  # Eq. O1
        nu = torch.where(y == 0, torch.full((b,), kappa), torch.ones(b))
        off = st.offpolicy_weight * nu * a_log / b
        metrics["abpo/offpolicy/anchor_advantage_mean"] = float(a_log.mean())
        if (y == 1).any():
            metrics["abpo/offpolicy/anchor_advantage_positive"] = float(a_log[y == 1].mean())
        if (y == 0).any():
            metrics["abpo/offpolicy/anchor_advantage_no_response"] = float(a_log[y == 0].mean())
    ll_rows = torch.zeros(b * k)
    off_rows = torch.zeros(b * k)
    ll_rows[::k] = ll.float()
    off_rows[::k] = off.float()
    return ll_rows, off_rows, torch.log(e0).float().repeat_interleave(k)


def anchor_row_inputs(
    inputs: Sequence[dict],
    coefs: AnchorCoefficients,
    process_index: int,
    answers: AnswerTokens,
    tokenizer: Any,
    tries: AnswerTries | None,
) -> dict[str, torch.Tensor]:
    """The anchor terms' inputs of this process's rows (they travel with the rows through TRL's shuffle and split
    of the generation batch), on the CPU: the logged item's answer ids + EOS (what SFT trains and the rollouts end
    with), their mask, this process's slice of the coefficients of :func:`anchor_coefficients`, log e0 and, with
    constrained rollouts (``tries``), the allowed tokens of every position (abpo.policy.constrained Eq. q)."""
    ll, off, log_e0 = coefs
    n_local = len(inputs)
    part = slice(process_index * n_local, (process_index + 1) * n_local)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    comps = [answers.ids(x["anchor_text"]) + [eos] for x in inputs]
    length = max(len(c) for c in comps)
    ids = torch.full((n_local, length), pad, dtype=torch.long)
    mask = torch.zeros((n_local, length), dtype=torch.long)
    for r, c in enumerate(comps):
        ids[r, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[r, : len(c)] = 1
    out = {
        "abpo_anchor_ids": ids,
        "abpo_anchor_mask": mask,
        "abpo_anchor_ll_coef": ll[part],
        "abpo_anchor_off_coef": off[part],
        "abpo_anchor_log_e0": log_e0[part],
    }
    if tries is not None:
        from abpo.policy.constrained import allowed_tensor

        out["abpo_anchor_allowed"] = allowed_tensor([tries.trie(x) for x in inputs], comps, length)
    return out


def anchor_rows(inputs: dict, constrained: bool):
    """The rows of a micro-batch whose logged item has a term (a non-zero coefficient of Eq. L1 or O3: one row
    per logged example, :func:`anchor_coefficients`), as (row indices, answer ids, answer mask, allowed tokens or
    None), the answers cut to their longest; None when the micro-batch holds none."""
    coef = (inputs["abpo_anchor_ll_coef"] != 0) | (inputs["abpo_anchor_off_coef"] != 0)
    sel = coef.nonzero().squeeze(-1)
    if sel.numel() == 0:
        return None
    mask = inputs["abpo_anchor_mask"][sel]
    length = int(mask.sum(-1).max())
    allowed = inputs["abpo_anchor_allowed"][sel, :length] if constrained else None
    return sel, inputs["abpo_anchor_ids"][sel, :length], mask[:, :length], allowed
