"""pi_init, before stage 1: the item tokens' embedding rows from matrix-factorisation factors (``sft.item_init``).

The tiny model has one vocabulary token per catalog item (abpo.policy.tokenizer) whose embedding is tied with the LM
head, so one row w_i both reads item i in a history and scores it as the next item (Eq. next-item of
abpo.policy.pretrain: h_t . w_i). With ``sft.item_init: random`` those rows start at the model's random init and stage
1 must learn the collaborative signal from scratch; with ``als`` they start from the item factors of an implicit ALS
fitted on the same training interactions (Eq. item-init below), the collaborative embeddings in the LLM's item tokens
of CoLLM (Zhang et al., 2023, "CoLLM: Integrating Collaborative Embeddings into Large Language Models for
Recommendation") and LLaRA (Liao et al., 2024, "LLaRA: Large Language-Recommendation Assistant"). Those map the
collaborative embeddings into the token space through a learnt projection; here the factorisation's rank is the
model's hidden size, so the factors are the rows themselves, up to one scale.

What is read: the training sequences x_{1:T} of every split user, exactly the dict stage 1 trains on
(abpo.policy.sft.training_sequences); never the update range x_{T+1..T+N-1} (the validation users' early stopping),
nor the held-out target x_{T+N}.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from abpo.config.policy import ITEM_INITS
from abpo.policy.prompt import check_item_tokens

log = logging.getLogger(__name__)


@dataclass
class ItemInitResult:
    method: str
    n_items: int  # catalog items (item tokens)
    n_initialised: int  # items with at least one training interaction: their rows were set
    scale: float  # c of Eq. item-init (0.0 when nothing was set)
    seconds: float = 0.0


def als_item_factors(
    train_sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int], *, rank: int, seed: int
) -> np.ndarray:
    """Item factors q_i (``[len(item_ids), rank]``, ``item_ids`` order) of the project's ALS (abpo.baselines.als,
    implicit's AlternatingLeastSquares at its defaults: regularisation 0.05, alpha 1, 15 iterations, the ML-retrain
    baseline's settings) fitted at ``rank`` factors on the user x item count matrix of ``train_sequences``."""
    from abpo.baselines.als import ALSRanker

    ranker = ALSRanker(factors=rank, seed=seed).fit(train_sequences, list(item_ids))
    fitted = ranker.model
    if fitted is None:
        raise RuntimeError("ALSRanker.fit left no model")
    q = np.asarray(fitted.item_factors, dtype=np.float64)
    if q.shape != (len(item_ids), rank):
        raise ValueError(f"ALS item factors of shape {q.shape}; expected {(len(item_ids), rank)}")
    return q


def rescaled_factor_rows(factors: np.ndarray, random_rows: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, float]:
    """Eq. item-init on arrays: the rows ``random_rows`` (the item tokens' random init, ``[I, H]``) with every row of
    ``seen`` (bool ``[I]``) replaced by c * factors, and c. Rows not seen are returned unchanged.

        (Eq. item-init)  w_i = c * q_i   for i in S (items with at least one training interaction),
                         w_i = w_i^0     otherwise,
                         c   = mean_{j in catalog} ||w_j^0|| / mean_{i in S} ||q_i||

    w^0 the random init's rows. One scalar for every row keeps the factors' directions and relative norms (ALS puts
    popularity into the norm) and gives the set rows the random init's mean norm, the scale the decoder's first layer
    and the LM head's logits were initialised for."""
    rows = np.array(random_rows, dtype=np.float64, copy=True)
    seen = np.asarray(seen, dtype=bool)
    if factors.shape[0] != rows.shape[0] or factors.shape[1] != rows.shape[1] or seen.shape != (rows.shape[0],):
        raise ValueError(f"factors {factors.shape}, rows {rows.shape}, seen {seen.shape}: shapes differ")
    if not seen.any():
        return rows, 0.0
    q_norm = float(np.linalg.norm(factors[seen], axis=1).mean())
    if not q_norm > 0 or not np.isfinite(q_norm):
        return rows, 0.0  # a degenerate factorisation (all zero): nothing to take over
    c = float(np.linalg.norm(rows, axis=1).mean()) / q_norm
    rows[seen] = c * factors[seen]
    return rows, c


def init_item_embeddings(
    model,
    tokenizer,
    train_sequences: Mapping[int, Sequence[int]],
    item_ids: Sequence[int],
    *,
    method: str,
    seed: int = 0,
) -> ItemInitResult:
    """Set ``model``'s item-token rows in place by Eq. item-init (:func:`rescaled_factor_rows`) from the factors of
    ``method`` (``als``: :func:`als_item_factors` at rank = the model's hidden size) fitted on ``train_sequences``
    (user -> item ids x_{1:T}); ``item_ids`` is the catalog. The input embedding is tied with the LM head, so the head
    reads the same rows (an untied head of the same shape gets the same rows written). ``random`` changes nothing and
    draws no random number."""
    import torch

    if method not in ITEM_INITS:
        raise ValueError(f"sft.item_init={method!r}; rule: one of {list(ITEM_INITS)}")
    catalog = sorted({int(i) for i in item_ids})
    if method == "random":
        return ItemInitResult(method, len(catalog), 0, 0.0)
    t0 = time.time()
    try:
        vocab = check_item_tokens(tokenizer, catalog)
    except ValueError as e:
        raise ValueError(f"sft.item_init={method} sets the item tokens' rows: {e}") from None
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    hidden = int(emb.shape[1])
    seen_items = {int(i) for s in train_sequences.values() for i in s}
    seen = np.array([i in seen_items for i in catalog], dtype=bool)
    train = {int(u): [int(i) for i in s] for u, s in train_sequences.items() if len(s)}
    factors = als_item_factors(train, catalog, rank=hidden, seed=seed) if train else np.zeros((len(catalog), hidden))
    idx = torch.tensor(vocab, dtype=torch.long, device=emb.device)
    with torch.no_grad():
        rows, c = rescaled_factor_rows(factors, emb[idx].detach().cpu().double().numpy(), seen)
        new = torch.as_tensor(rows, dtype=emb.dtype, device=emb.device)
        emb[idx] = new
        if head is not None and head.weight is not emb and head.weight.shape == emb.shape:
            head.weight[idx] = new.to(head.weight.device, head.weight.dtype)
    n_set = int(seen.sum()) if c > 0 else 0
    res = ItemInitResult(method, len(catalog), n_set, c, time.time() - t0)
    log.info(
        f"item init ({method}): {n_set} of {len(catalog)} item-token rows set from rank-{hidden} factors of the "
        f"training sequences (scale {c:.4g}), the rest keep their random init ({res.seconds:.1f}s)"
    )
    return res
