"""The ABPO terms of the trainer (docs/ABPO_SPEC.md steps 2-4): e_old and self-certainty under the current policy,
and the variant's advantages of a generation batch with the step's metrics. A mixin of `ABPOTrainer`
(abpo.train.trainer): it reads the trainer's settings (`self.abpo`), variant, model, tokenizer and accelerator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from abpo.algo.anchor_terms import anchor_advantage, likelihood_coefficients
from abpo.algo.rewards import anchor_reward, self_certainty, simulated_click_reward, total_reward
from abpo.algo.snips import effective_sample_size, snips_weight, stratified_self_normalise
from abpo.algo.stratum_weight import no_response_abs_share, stratum_weighted_advantages
from abpo.algo.variants import Variant, anchor_weights, rollout_advantages
from abpo.policy.prompt import encode_answer
from abpo.policy.scoring import candidate_propensities, score_prompt_ids, scores_on_choice
from abpo.train.diagnostics import step_diagnostics
from abpo.train.records import ABPOSettings, CandidateSet, RolloutRecord


class AdvantagesMixin:
    """e_old, r_sc and the advantages of `ABPOTrainer` (see abpo.train.trainer for the attributes it reads)."""

    # what ABPOTrainer and trl.GRPOTrainer give this mixin (annotations for the type checker; no runtime attribute)
    abpo: ABPOSettings
    variant: Variant
    accelerator: Any
    processing_class: Any
    _title_len_cache: dict[str, int]
    _answer_ids_cache: dict[str, list[int]]
    _abpo_anchor_coefs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    _trie: Any  # abpo.train.rollouts.RolloutsMixin._trie

    def _title_tokens(self, answer: str) -> int:
        """Token count of the title inside a candidate answer ``<item_id>ID</item_id><item>TITLE</item>``."""
        n = self._title_len_cache.get(answer)
        if n is None:
            from abpo.policy.prompt import ITEM_CLOSE, ITEM_OPEN

            start = answer.find(ITEM_OPEN)
            end = answer.rfind(ITEM_CLOSE)
            title = answer[start + len(ITEM_OPEN) : end] if 0 <= start < end else answer
            n = len(self.processing_class(title, add_special_tokens=False)["input_ids"])
            if len(self._title_len_cache) < 200_000:
                self._title_len_cache[answer] = n
        return n

    def _answer_ids(self, text: str) -> list[int]:

        ids = self._answer_ids_cache.get(text)
        if ids is None:
            ids = encode_answer(self.processing_class, text)
            if len(self._answer_ids_cache) < 200_000:
                self._answer_ids_cache[text] = ids
        return ids

    def _unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    @torch.no_grad()
    def _e_old(self, prompt_ids: list[int], answers: Sequence[str], candidates: Sequence[int], a_log: int) -> float:
        """e_old(a_log | q) of one logged example (see `_e_old_batch`)."""
        return self._e_old_batch([(CandidateSet(prompt_ids, answers, candidates), a_log)])[0]

    @torch.no_grad()
    def _e_old_batch(self, items: Sequence[tuple[CandidateSet, int]]) -> list[float]:
        """e_old(a_log | q) = softmax_C(s_old / tau)[a_log] (docs/ABPO_SPEC.md "Propensities", step 3) under the rollout
        policy pi_old for every (candidate set, a_log), scored together by the policy
        helper's batched scorer (``score_prompt_ids``) over each example's whole candidate set, with the s_p e0 was
        logged with (ABPOSettings carries prompt_style and scoring_batch_tokens): the item token's log-prob, or the
        mean over each answer's (cached) token ids."""
        dists = self._e_old_dists([cset for cset, _ in items])
        return [float(e[list(cset.candidates).index(a_log)]) for e, (cset, a_log) in zip(dists, items, strict=True)]

    @torch.no_grad()
    def _e_old_dists(self, items: Sequence[CandidateSet]) -> list[torch.Tensor]:
        """e_old(. | q) = softmax_C(s_old / tau) over each example's whole candidate set C (docs/ABPO_SPEC.md
        "Propensities"), [|C|] per (prompt ids, candidate answers, candidates), in the candidates' order: the SNIPS
        weight's numerator (step 3) and pi of the diagnostics' Eq. G (abpo.algo.diagnostics)."""

        if not items:
            return []
        answer_ids = None if scores_on_choice(self.abpo) else [[self._answer_ids(a) for a in c.answers] for c in items]
        scores = score_prompt_ids(
            self._unwrapped(),
            self.processing_class,
            [c.prompt_ids for c in items],
            [list(c.candidates) for c in items],
            answer_ids,
            self.abpo,
        )
        return [candidate_propensities(s, self.abpo.tau).detach().cpu() for s in scores]

    @torch.no_grad()
    def _self_certainty(
        self, pairs: list[tuple[list[int], list[int]]], rows: Sequence[dict] | None = None
    ) -> list[float]:
        """r_sc = mean over the positions t of update.self_certainty_positions of KL(U || pi_theta(. | q, a_<t))
        (docs/ABPO_SPEC.md step 2) of each (prompt ids, completion ids) under the current policy, in chunks of the
        per-device batch.

        The spec averages over all T tokens of the completion (``answer``). By default (``choice``) only the tokens
        that carry a choice count (``AnswerTrie.choice_mask`` of the row's candidate set, ``rows[i]``; see
        `_sc_mask`): the tokens forced by the chosen item (for item-token models, everything after the item token;
        for text models, the title once the id is fixed) would measure how confidently the model copies a title,
        which says nothing about the choice. For an item-token model r_sc is then KL(U || pi_theta(.|q)) at the item
        token, the same for every rollout of a group. Without ``rows`` every token counts.
        Prompts are left-padded and completions right-padded, with position ids from the attention mask (padding
        changes no position)."""
        if not pairs:
            return []
        model = self._unwrapped()
        device = self.accelerator.device
        pad = self.processing_class.pad_token_id
        chunk = max(1, self.args.per_device_train_batch_size)
        out: list[float] = []
        was_training = model.training
        model.eval()
        try:
            for s in range(0, len(pairs), chunk):
                part = pairs[s : s + chunk]
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
                        row = rows[s + r] if rows is not None else None
                        cm = self._sc_mask(row, c) if row is not None else [1] * len(c)
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
                out += self_certainty(logits[:, :C].float(), cmask.to(device)).cpu().tolist()
        finally:
            model.train(was_training)
        return out

    def _abpo_advantages(self, inputs, output, rewards_per_func: torch.Tensor, k: int):
        """Advantages [N_local] of this process's rollouts for the variant, and the step's metrics."""
        v, st = self.variant, self.abpo
        n_local = len(inputs)
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(output["prompt_ids"].cpu(), output["prompt_mask"].cpu())]
        comp_ids = [
            row[m.bool()].tolist() for row, m in zip(output["completion_ids"].cpu(), output["completion_mask"].cpu())
        ]
        y_local = [int(x["y"]) for x in inputs]

        # Self-certainty of the rollouts of no-response rows (step 2); 0 elsewhere (never enters their reward).
        r_sc_local = [0.0] * n_local
        if v.self_certainty:
            rows = [i for i in range(n_local) if y_local[i] == 0]
            recorded = getattr(self, "_abpo_rollout_sc", None)  # from the generation logits (HF generate)
            if recorded is not None and len(recorded) == n_local:
                vals = [recorded[i] for i in rows]
            else:
                vals = self._self_certainty([(prompt_ids[i], comp_ids[i]) for i in rows], [inputs[i] for i in rows])
            for i, val in zip(rows, vals):
                r_sc_local[i] = val

        # Per logged example (once per process even when its rows repeat here): e_old and the anchor's r_sc.
        first_row: dict[str, int] = {}
        for i, x in enumerate(inputs):
            first_row.setdefault(str(x["request_id"]), i)
        # e_old(.|q) over C for every variant: the SNIPS weight of D and F, and the diagnostics of all (B included)
        todo = list(first_row.items())
        dists = self._e_old_dists(
            [CandidateSet(prompt_ids[i], inputs[i]["candidate_answers"], inputs[i]["candidates"]) for _, i in todo]
        )
        pi_ex = {rid: d for (rid, _), d in zip(todo, dists)}
        e_old_ex = {
            rid: float(d[list(inputs[i]["candidates"]).index(int(inputs[i]["a_log"]))])
            for (rid, i), d in zip(todo, dists)
        }
        sc_log_ex: dict[str, float] = {}
        if v.anchor and v.self_certainty:
            eos = self.processing_class.eos_token_id  # what SFT appends after an answer (abpo.policy.sft)
            todo = [(rid, i) for rid, i in first_row.items() if y_local[i] == 0]
            pairs = [(prompt_ids[i], self._answer_ids(inputs[i]["anchor_text"]) + [eos]) for _, i in todo]
            for (rid, _), val in zip(todo, self._self_certainty(pairs, [inputs[i] for _, i in todo])):
                sc_log_ex[rid] = val

        chosen_local = self._abpo_chosen_local
        if chosen_local is None or len(chosen_local) != n_local:
            raise RuntimeError(
                "ABPOTrainer: the rollouts' chosen candidates were not recorded by _calculate_rewards; the TRL "
                "internals changed (see tests/train/test_trl_contract.py)"
            )
        # the popularity and title tokens of the item a scored rollout chose (NaN for the others)
        popularity_local, title_tokens_local = [math.nan] * n_local, [math.nan] * n_local
        if v.self_certainty:
            for i, x in enumerate(inputs):
                if y_local[i] == 0 and chosen_local[i] >= 0:
                    item = int(x["candidates"][chosen_local[i]])
                    pop = float(self.item_popularity.get(item, 0)) if self.item_popularity is not None else math.nan
                    popularity_local[i] = pop
                    title_tokens_local[i] = float(self._title_tokens(x["candidate_answers"][chosen_local[i]]))
        # the simulator's reward of each rollout (settings.reward = simulated_click: issue 49's online upper bound)
        sim_local = [math.nan] * n_local
        if st.reward == "simulated_click":
            for i, x in enumerate(inputs):
                p_click = torch.tensor([list(x["candidate_click_prob"])], dtype=torch.float64)
                sim_local[i] = float(simulated_click_reward(torch.tensor([[chosen_local[i]]]), p_click)[0, 0])
        local = []
        for i, x in enumerate(inputs):
            rid = str(x["request_id"])
            local.append(
                RolloutRecord(
                    request_id=rid,
                    y=y_local[i],
                    e0=float(x["e0"]),
                    r_sc=r_sc_local[i],
                    e_old=e_old_ex.get(rid, math.nan),
                    anchor_sc=sc_log_ex.get(rid, 0.0),
                    chosen=chosen_local[i],
                    pi=pi_ex[rid].tolist() if first_row[rid] == i else None,
                    a_log_index=list(x["candidates"]).index(int(x["a_log"])),
                    popularity=popularity_local[i],
                    title_tokens=title_tokens_local[i],
                    sim_click=sim_local[i],
                )
            )
        # every process's records, in TRL's gather order (rewards_per_func's order)
        records: list[RolloutRecord] = gather_object(local)
        n = len(records)
        if rewards_per_func.shape[0] != n or n % k:
            raise RuntimeError(
                f"ABPOTrainer: {rewards_per_func.shape[0]} gathered rewards for {n} gathered rows, group size {k}; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        b = n // k
        groups = [records[g * k : (g + 1) * k] for g in range(b)]
        for g, grp in enumerate(groups):
            if len({r.request_id for r in grp}) != 1:
                raise RuntimeError(
                    f"ABPOTrainer: group {g} of the generation batch mixes logged examples "
                    f"{sorted({r.request_id for r in grp})}; "
                    "rule: TRL's sampler keeps one example's num_generations rollouts together"
                )
        y = torch.tensor([grp[0].y for grp in groups], dtype=torch.int64)  # [B]
        if self.model.training and not ((y == 1).any() and (y == 0).any()):
            raise RuntimeError(
                f"ABPOTrainer: the generation batch of optimizer step {self.state.global_step + 1} holds only y = "
                f"{int(y[0])} rows; rule: every SNIPS mini-batch holds both positive and no-response rows "
                "(docs/ABPO_SPEC.md "
                "step 3: w_hat is self-normalised inside B_1 and B_0). The batches of abpo.train.dataset are built "
                "so; a batch without one stratum means the dataset was not built by update_dataset_from_strata"
            )
        rpf = rewards_per_func.detach().float().cpu()
        r_fmt = rpf[:, 0].view(b, k)
        r_match = rpf[:, 1].view(b, k)
        if st.reward == "simulated_click":  # r_sim replaces r_match (abpo.algo.rewards.simulated_click_reward)
            r_match = torch.tensor([r.sim_click for r in records], dtype=torch.float32).view(b, k)
            metrics_sim = {"abpo/reward/simulated_click_mean": float(r_match.mean())}
        else:
            metrics_sim = {}
        lam = v.effective_lambda_sc(st.lambda_sc)
        r_sc = torch.tensor([r.r_sc for r in records], dtype=torch.float32).view(b, k) if v.self_certainty else None
        r_roll = total_reward(r_match, r_fmt, r_sc, y, lam)  # [B, K] step 2

        metrics: dict[str, float] = dict(metrics_sim)
        r_log = w = None
        if v.anchor:
            sc_log = (
                torch.tensor([grp[0].anchor_sc for grp in groups], dtype=torch.float32) if v.self_certainty else None
            )
            r_log = anchor_reward(y, sc_log, lam)  # [B] step 2, last bullet
            metrics["abpo/reward/anchor_mean"] = r_log.mean().item()
        if v.anchor and v.snips:
            e0 = torch.tensor([grp[0].e0 for grp in groups], dtype=torch.float64)
            e_old = torch.tensor([grp[0].e_old for grp in groups], dtype=torch.float64)
            if torch.isnan(e_old).any():
                raise RuntimeError("ABPOTrainer: e_old missing for a logged example after the gather")
            w = snips_weight(e_old, e0)  # step 3: w = e_old / e0
            if st.w_max > 0:
                w = w.clamp(max=st.w_max)
            w_hat = stratified_self_normalise(w, y, st.delta)
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
            w = w.float()
        adv = rollout_advantages(v, r_log, r_roll, y, w, delta=st.delta, eps_std=st.eps_std)  # [B, K] step 4
        # the no-response rows' weight kappa (docs/update-variants.md Eq. N1; kappa = 1, the paper, changes nothing)
        kappa = st.no_response_kappa()
        adv = stratum_weighted_advantages(adv, y, kappa, st.click_weight)
        if kappa != 1.0 or st.no_response_weight_rule != "fixed":
            metrics["abpo/no_response_weight"] = kappa
            if st.click_rate is not None:
                metrics["abpo/no_response_weight_click_rate"] = float(st.click_rate)
        self._abpo_anchor_coefs = (
            self._anchor_coefficients(groups, y, r_roll, kappa, metrics) if st.anchor_terms else None
        )

        # Metrics of docs/ABPO_SPEC.md / the issue: reward components, match rates per stratum, advantage stats.
        pos = (y == 1)[:, None].expand(b, k)
        neg = ~pos
        hit_pos = (r_match == 1.0) & pos
        hit_neg = (r_match == -1.0) & neg
        metrics.update(
            {
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
                # issue 49 point 2: how much of the step's push the no-response rows carry (after kappa)
                "abpo/advantages/no_response_abs_share": no_response_abs_share(adv, y),
            }
        )
        if pos.any():
            metrics["abpo/match_rate/positive"] = (hit_pos.sum() / pos.sum()).item()
        if neg.any():
            metrics["abpo/match_rate/no_response"] = (hit_neg.sum() / neg.sum()).item()
        if r_sc is not None and neg.any():
            metrics["abpo/reward/self_certainty_mean"] = r_sc[neg].mean().item()
        metrics.update(
            step_diagnostics(
                v,
                st,
                groups,
                y,
                r_match,
                r_fmt,
                r_roll,
                r_sc,
                adv,
                sc_trace=self._abpo_sc_trace,
                training=self.model.training,
                with_popularity=self.item_popularity is not None,
            )
        )

        flat = adv.reshape(-1)
        start = self.accelerator.process_index * n_local  # TRL's process slice
        return flat[start : start + n_local].clone(), metrics

    def _anchor_coefficients(
        self, groups: list[list[RolloutRecord]], y: torch.Tensor, r_roll: torch.Tensor, kappa: float, metrics: dict
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The logged items' own terms of the generation batch (docs/update-variants.md), as per-row tensors over
        the gathered rows [B * K] (each logged example's coefficient on the first of its K rows, 0 on the others, so
        that the loss scores each anchor once): c_ll = lambda_ll y w_hat / B (Eq. L1), c_off = lambda_off nu_y
        A^log / B (Eqs. O1, O3) and log e0(a^log | q). w = e_old / e0 as step 3 (capped by update.w_max); A^log
        under the variant's baseline and spread (B: the rollouts' plain mean and spread)."""
        v, st = self.variant, self.abpo
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

    def _attach_anchor_rows(self, inputs, output) -> None:
        """The anchor terms' inputs on this process's rows of ``output`` (they travel with the rows through TRL's
        shuffle and split of the generation batch): the logged item's answer ids + EOS (what SFT trains and the
        rollouts end with), their mask, the coefficients of `_anchor_coefficients`, log e0 and, with constrained
        rollouts, the allowed tokens of every position (abpo.policy.constrained Eq. q)."""
        if self._abpo_anchor_coefs is None:
            raise RuntimeError("ABPOTrainer: the anchor terms' coefficients of this generation batch are missing")
        ll, off, log_e0 = self._abpo_anchor_coefs
        n_local = len(inputs)
        part = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        eos = self.processing_class.eos_token_id
        pad = self.processing_class.pad_token_id
        comps = [self._answer_ids(x["anchor_text"]) + [eos] for x in inputs]
        length = max(len(c) for c in comps)
        ids = torch.full((n_local, length), pad, dtype=torch.long)
        mask = torch.zeros((n_local, length), dtype=torch.long)
        for r, c in enumerate(comps):
            ids[r, : len(c)] = torch.tensor(c, dtype=torch.long)
            mask[r, : len(c)] = 1
        dev = output["completion_ids"].device
        output["abpo_anchor_ids"] = ids.to(dev)
        output["abpo_anchor_mask"] = mask.to(dev)
        output["abpo_anchor_ll_coef"] = ll[part].to(dev)
        output["abpo_anchor_off_coef"] = off[part].to(dev)
        output["abpo_anchor_log_e0"] = log_e0[part].to(dev)
        if self.abpo.constrained_rollouts:
            from abpo.policy.constrained import allowed_tensor

            output["abpo_anchor_allowed"] = allowed_tensor([self._trie(x) for x in inputs], comps, length).to(dev)

    def _pad_token_id(self) -> int:
        return int(self.processing_class.pad_token_id)

    def _anchor_rows(self, inputs):
        """The rows of a micro-batch whose logged item has a term (a non-zero coefficient of Eq. L1 or O3: one row
        per logged example, `_anchor_coefficients`), as (row indices, answer ids, answer mask, allowed tokens or
        None), the answers cut to their longest; None when the micro-batch holds none."""
        coef = (inputs["abpo_anchor_ll_coef"] != 0) | (inputs["abpo_anchor_off_coef"] != 0)
        sel = coef.nonzero().squeeze(-1)
        if sel.numel() == 0:
            return None
        mask = inputs["abpo_anchor_mask"][sel]
        length = int(mask.sum(-1).max())
        allowed = inputs["abpo_anchor_allowed"][sel, :length] if self.abpo.constrained_rollouts else None
        return sel, inputs["abpo_anchor_ids"][sel, :length], mask[:, :length], allowed
