"""D_bandit as the rows ABPOTrainer reads: the warehouse's strata, prompts rebuilt, stratified batch order.

One row per logged exposure (docs/ABPO_SPEC.md "Data objects", D_bandit) with the columns the trainer and its reward
functions read (TRL hands every dataset column to the reward functions as a keyword argument):

    prompt        [{"role": "user", "content": q}]   conversational: TRL applies the chat template itself, the
                  same template `abpo.policy.prompt.render_chat` applies when the log was scored (same tokens)
    request_id    the impression id (groups are checked against it: a group never mixes two exposures)
    candidates    C (item ids, in the order shown to the model)
    candidate_answers  r(a) = format_answer(a, title) for each a in C (e_old is scored over them each step)
    a_log         the exposed item, y the feedback (1 click, 0 no response), e0 = e0(a_log | q) from the log
    anchor_text   r(a_log) = format_answer(a_log, title): the anchor's well-formed text

Row order is the batch order: every consecutive block of `examples_per_batch` rows is one optimizer step's
generation batch (the SNIPS mini-batch of step 3) and holds both strata, as `abpo.warehouse.stratified_batches`
builds them. The trainer reads the rows in this order (GRPOConfig.shuffle_dataset=False); the seeded shuffle
happens in `stratified_batches`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError
from abpo.policy.prompt import format_answer, request_prompt

if TYPE_CHECKING:
    from abpo.config.policy import PolicyConfig

COLUMNS = ("prompt", "request_id", "candidates", "candidate_answers", "a_log", "y", "e0", "anchor_text")
# carried when the logged rows have it: the simulator's P(click) per candidate (ABPOSettings.reward = simulated_click)
OPTIONAL_COLUMNS = ("candidate_click_prob",)


class UpdateDataError(ExpectedError, ValueError):
    """D_bandit cannot be turned into update batches; the message names the row and the rule."""


@dataclass
class BatchingReport:
    """What went into the update batches (printed by the CLI and logged to MLflow as params)."""

    positive_rows: int = 0
    no_response_rows: int = 0
    examples_per_batch: int = 0
    batches: int = 0
    rows_in_batches: int = 0
    rows_not_in_batches: int = 0  # rows of the strata left out by the batcher (reported, never silent)
    rows_repeated: int = 0  # rows used twice in the epoch (the smaller stratum is recycled to fill batches)
    history_items_dropped: int = 0  # oldest history items dropped to fit policy.max_prompt_tokens
    notes: list[str] = field(default_factory=list)

    def as_params(self) -> dict[str, Any]:
        return {
            "data.positive_rows": self.positive_rows,
            "data.no_response_rows": self.no_response_rows,
            "data.examples_per_batch": self.examples_per_batch,
            "data.batches": self.batches,
            "data.rows_in_batches": self.rows_in_batches,
            "data.rows_not_in_batches": self.rows_not_in_batches,
            "data.rows_repeated": self.rows_repeated,
            "data.history_items_dropped": self.history_items_dropped,
            "data.notes": "; ".join(self.notes)[:480],
        }


# the experiment's exploration logger (abpo.experiment.regimes, logger uniform): e0 = 1/|C|
UNIFORM_RULE = "uniform"
_SOFTMAX_RULE = re.compile(r"^softmax\(tau=([0-9.eE+-]+)\)$")
# what the ranker arms write (abpo.arms.rankers): softmax(score/T, T=X) <ranker>, X > 0
_RANKER_RULE = re.compile(r"^softmax\(score/T, T=([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\) [a-z][a-z0-9_]*$")


def logged_tau(logging_policy: object) -> float:
    """tau of a ``softmax(tau=X)`` logging rule (what `abpo.policy.bandit` and the LLM arms write into the log's
    ``logging_policy``); ValueError for any other rule."""
    m = _SOFTMAX_RULE.match(str(logging_policy).strip())
    if not m:
        raise ValueError(f"logging_policy {logging_policy!r} is not softmax(tau=X)")
    return float(m.group(1))


def _check_tau(row: Mapping[str, Any], tau: float, where: str) -> None:
    """e0 was computed as softmax(s/tau_log); e_old = softmax(s_old/tau) is only comparable with it (the SNIPS
    weight e_old/e0 of step 3) when tau == tau_log. A row a ranker arm logged (``softmax(score/T, T=X) <ranker>``,
    arms.update_logs = all) carries the ranker's exact propensity of a_log over the same C: e_old/e0 is then an
    importance weight between two different policies (no tau to match), and the row is accepted."""
    rid = row.get("impression_id", "?")
    rule = row.get("logging_policy")
    m = _RANKER_RULE.match(str(rule).strip())
    if m and float(m.group(1)) > 0:
        return
    if str(rule).strip() == UNIFORM_RULE:
        # uniform exploration over C (the experiment's `uniform` logger): e0 = 1/|C| exactly, whatever the scores
        m_c = len(row["candidates"])
        if not math.isclose(float(row["propensity"]), 1.0 / m_c, rel_tol=1e-6):
            raise UpdateDataError(
                f"{where} impression {rid}: logged {UNIFORM_RULE} with propensity {row['propensity']} over {m_c} "
                f"candidates; rule: a uniform logger's e0 is 1/|C| = {1.0 / m_c:.6g}"
            )
        return
    try:
        tau_log = logged_tau(rule)
    except ValueError as e:
        raise UpdateDataError(
            f"{where} impression {rid}: {e}; rule: the update recomputes e_old = softmax(s/tau) over C, which needs "
            "a log written by a softmax(tau) logging policy (or a ranker's softmax(score/T, T=X) <ranker>, or "
            "uniform) over the same candidates"
        ) from None
    if not math.isclose(tau_log, tau, rel_tol=1e-9, abs_tol=1e-12):
        raise UpdateDataError(
            f"{where} impression {rid}: logged with {rule} but policy.tau={tau}; rule: e_old must use the tau of the "
            "logging policy's e0 (set policy.tau to the logged value)"
        )


def _check_row(row: Mapping[str, Any], titles: Mapping[int, str], where: str) -> None:
    rid = row.get("impression_id", "?")
    cands = [int(c) for c in row["candidates"]]
    if int(row["item_id"]) not in cands:
        raise UpdateDataError(
            f"{where} impression {rid}: item_id {row['item_id']} is not in its candidates (rule: a_log in C)"
        )
    p = float(row["propensity"])
    if not 0.0 < p <= 1.0:
        raise UpdateDataError(f"{where} impression {rid}: propensity {p} (rule: 0 < e0 <= 1)")
    if int(row["clicked"]) not in (0, 1):
        raise UpdateDataError(f"{where} impression {rid}: clicked {row['clicked']} (rule: y in {{0, 1}})")
    missing = [i for i in [*row["history"], *cands] if int(i) not in titles]
    if missing:
        raise UpdateDataError(f"{where} impression {rid}: item ids {missing[:5]} are not in the catalog")


def example_row(
    row: Mapping[str, Any], titles: Mapping[int, str], tokenizer, policy_cfg: PolicyConfig, where: str = "D_bandit"
) -> dict:
    """One impression (IMPRESSIONS_SCHEMA dict) -> one trainer row (see the module docstring)."""

    _check_row(row, titles, where)
    _check_tau(row, float(policy_cfg.tau), where)
    cands = [int(c) for c in row["candidates"]]
    # the same prompt builder as the logging policy's e0 (abpo.policy.bandit -> example_prompt): e_old and e0 are
    # then propensities of the same prompt, and the rollouts answer the prompt the log was served with
    fitted = request_prompt(
        tokenizer, [(int(i), titles[int(i)]) for i in row["history"]], [(c, titles[c]) for c in cands], policy_cfg
    )
    a_log = int(row["item_id"])
    return {
        "prompt": [{"role": "user", "content": fitted.user_text}],
        "request_id": str(row["impression_id"]),
        "candidates": cands,
        "candidate_answers": [format_answer(c, titles[c]) for c in cands],
        "a_log": a_log,
        "y": int(row["clicked"]),
        "e0": float(row["propensity"]),
        "anchor_text": format_answer(a_log, titles[a_log]),
        "_history_dropped": fitted.history_dropped,
        **_click_probs(row, cands, where),
    }


def _click_probs(row: Mapping[str, Any], cands: Sequence[int], where: str) -> dict:
    """The optional column candidate_click_prob (the simulator's P(click) of every candidate, for the trainer's
    reward = simulated_click: the online upper bound), checked and passed through; {} when the row has none."""
    probs = row.get("candidate_click_prob")
    if probs is None:
        return {}
    probs = [float(p) for p in probs]
    if len(probs) != len(cands) or not all(0.0 <= p <= 1.0 for p in probs):
        raise UpdateDataError(
            f"{where} impression {row.get('impression_id', '?')}: candidate_click_prob {probs[:5]}... for "
            f"{len(cands)} candidates; rule: one probability in [0, 1] per candidate"
        )
    return {"candidate_click_prob": probs}


def build_update_rows(
    batches: Iterable[Sequence[Mapping[str, Any]]],
    titles: Mapping[int, str],
    tokenizer,
    policy_cfg: PolicyConfig,
    *,
    examples_per_batch: int,
    report: BatchingReport,
) -> list[dict]:
    """Flatten stratified batches into trainer rows in batch order. Every batch must hold exactly
    `examples_per_batch` rows with both feedback values; an incomplete last batch is left out and counted in
    `report.rows_not_in_batches` (TRL only forms full generation batches)."""
    rows: list[dict] = []
    for b, batch in enumerate(batches):
        batch = list(batch)
        if len(batch) != examples_per_batch:
            report.rows_not_in_batches += len(batch)
            report.notes.append(
                f"batch {b}: {len(batch)} rows, not a full batch of {examples_per_batch}; left out of the update"
            )
            continue
        ys = {int(r["clicked"]) for r in batch}
        if ys != {0, 1}:
            raise UpdateDataError(
                f"stratified batch {b}: feedback values {sorted(ys)} (rule: every update batch holds both a "
                "positive and a no-response row, docs/ABPO_SPEC.md step 3)"
            )
        for r in batch:
            out = example_row(r, titles, tokenizer, policy_cfg, where=f"stratified batch {b}")
            report.history_items_dropped += out.pop("_history_dropped")
            rows.append(out)
        report.batches += 1
    report.rows_in_batches = len(rows)
    return rows


def to_hf_dataset(rows: list[dict]):
    """The rows as a `datasets.Dataset` (what trl.GRPOTrainer takes), columns in COLUMNS order."""
    from datasets import Dataset

    if not rows:
        raise UpdateDataError("D_bandit: no full stratified batch to train on (see the batching report)")
    extra = [c for c in OPTIONAL_COLUMNS if c in rows[0]]
    for c in extra:
        if not all(c in r for r in rows):
            raise UpdateDataError(f"D_bandit: column {c} on some rows only; rule: on every row or none")
    return Dataset.from_list([{k: r[k] for k in (*COLUMNS, *extra)} for r in rows])


def subsample_strata(positive, no_response, n: int, seed: int):
    """At most `n` logged rows, drawn without replacement (seeded) in the strata's proportions, keeping at least
    one row of each stratum. `n <= 0` or `n >= P + N` returns the strata unchanged. Returns (positive,
    no_response, note) where note says what was kept (for the batching report)."""
    import numpy as np
    import pyarrow as pa

    P, N = positive.num_rows, no_response.num_rows
    if n <= 0 or n >= P + N or P == 0 or N == 0:
        return positive, no_response, None
    k = min(max(int(round(n * P / (P + N))), 1), n - 1, P)
    rng = np.random.default_rng([int(seed), 0xAB70])
    pos_idx = np.sort(rng.choice(P, size=k, replace=False))
    neg_idx = np.sort(rng.choice(N, size=min(n - k, N), replace=False))
    note = f"update.max_examples={n}: kept {k} of {P} positive and {len(neg_idx)} of {N} no-response rows"
    return positive.take(pa.array(pos_idx)), no_response.take(pa.array(neg_idx)), note


def update_dataset_from_strata(
    positive,
    no_response,
    titles: Mapping[int, str],
    tokenizer,
    policy_cfg: PolicyConfig,
    *,
    examples_per_batch: int,
    seed: int,
    stratification: str = "oversample",
):
    """The warehouse's strata (two IMPRESSIONS_SCHEMA tables: y = 1 rows, y = 0 rows) -> (datasets.Dataset,
    BatchingReport), ordered in stratified batches of `examples_per_batch` logged examples
    (`update.stratification`: oversample | proportional, see abpo.warehouse.stratified_batches)."""
    from abpo.data.batching import STRATIFICATIONS, stratified_batches

    report = BatchingReport(
        positive_rows=positive.num_rows, no_response_rows=no_response.num_rows, examples_per_batch=examples_per_batch
    )
    if positive.num_rows == 0 or no_response.num_rows == 0:
        raise UpdateDataError(
            f"D_bandit: {positive.num_rows} positive and {no_response.num_rows} no-response rows; rule: the update "
            "needs both strata (stratified SNIPS mini-batches, docs/ABPO_SPEC.md step 3)"
        )
    if examples_per_batch < 2:
        raise UpdateDataError(
            f"update batch of {examples_per_batch} logged example(s): rule: >= 2 so both strata fit in one batch"
        )
    if stratification not in STRATIFICATIONS:
        raise UpdateDataError(f"update.stratification={stratification!r}; rule: {' | '.join(STRATIFICATIONS)}")
    batches = stratified_batches(positive, no_response, examples_per_batch, seed, mode=stratification)
    rows = build_update_rows(
        batches, titles, tokenizer, policy_cfg, examples_per_batch=examples_per_batch, report=report
    )
    total = positive.num_rows + no_response.num_rows
    unique = len({r["request_id"] for r in rows})
    report.rows_repeated = len(rows) - unique
    unused = total - unique
    if unused > 0 and report.rows_not_in_batches == 0:
        report.rows_not_in_batches = unused
        report.notes.append(f"{unused} logged rows were not placed in any batch by stratified_batches")
    return to_hf_dataset(rows), report
