"""pi_init, stage 1: next-item pre-training over each user's item-token sequence x_{1:T}.

The answer-format SFT (abpo.policy.sft, stage 2) sees one (prefix, next item) pair per prompt; a sequential model
learns far more per token from every position of a sequence at once. Stage 1 trains the tiny model (one vocabulary
token per item, abpo.policy.tokenizer) as a next-item model:

    (Eq. next-item)  L = - mean over users u, positions t < T_u of  log softmax_{i in V_items}( h_t . w_i )[x_{t+1}]

where h_t is the decoder's last hidden state after the item tokens x_1..x_t (the item token ids back to back, as
the item_tokens prompt shows a history, abpo.policy.prompt), w_i the LM head row of item i's token (tied with its
embedding), and the softmax runs over every item token of the catalog (a full softmax over items, not over the
whole vocabulary and not over a candidate set). Long sequences are cut into windows of ``sft.pretrain_max_length``
tokens that overlap by one item, so every transition is trained once per epoch.

Early stopping on the validation users only (``abpo.data.splits.split_of_user`` with
``experiment.validation_fraction``): their loss on the next items x_{T+1..T+N-1} after x_{1:T}, which no training
stage reads as a target, is measured after every epoch; training stops after ``sft.pretrain_patience`` epochs
without improvement and the best epoch's weights are kept. Test users' held-out targets x_{T+N} are never read.
Training data is x_{1:T} of every user (never the update range or the target).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from abpo.policy.prompt import check_item_tokens

log = logging.getLogger(__name__)


@dataclass
class PretrainResult:
    epochs_run: int
    best_epoch: int  # 1-based; 0 = no epoch improved on the starting weights
    train_losses: list[float] = field(default_factory=list)  # per epoch
    val_losses: list[float] = field(default_factory=list)  # per epoch (validation users' next items)
    val_hr10: list[float] = field(default_factory=list)  # per epoch: the next item in the top 10 of all items
    n_train_positions: int = 0
    n_val_positions: int = 0
    seconds: float = 0.0


def windows(sequence: Sequence[int], length: int) -> list[list[int]]:
    """``sequence`` cut into windows of at most ``length`` items that overlap by one item, so each transition
    (x_t -> x_{t+1}) is in exactly one window; a sequence of fewer than 2 items gives none."""
    if length < 2:
        raise ValueError(f"sft.pretrain_max_length={length}; rule: at least 2 (one transition)")
    seq = list(sequence)
    if len(seq) < 2:
        return []
    return [seq[s : s + length] for s in range(0, len(seq) - 1, length - 1)]


def item_vocabulary(tokenizer, item_ids: Sequence[int]) -> torch.Tensor:
    """The item tokens' vocabulary ids, ``[I]`` in ``item_ids`` order: item index k <-> vocabulary id [k]."""

    return torch.tensor(check_item_tokens(tokenizer, list(item_ids)), dtype=torch.long)


def _decoder_and_head(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def _batches(rows: list[list[int]], batch_size: int, rng: np.random.Generator | None):
    """Batches of windows of similar length (sorted by length, then the batch order shuffled when ``rng``)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(chunks)
    return chunks


def next_item_loss(
    decoder,
    head,
    item_vocab: torch.Tensor,
    batch: list[list[int]],
    target_from: list[int] | None = None,
    *,
    with_hits: bool = False,
) -> tuple[torch.Tensor, int, int]:
    """Eq. next-item over a batch of windows of item indices (into ``item_vocab``, the item tokens' vocabulary ids):
    the summed cross-entropy of each window's next items (from position ``target_from[r]`` on, default 1), the number
    of targets, and (``with_hits``) how many targets are in the top 10 of all items."""
    device = head.weight.device
    n, longest = len(batch), max(len(r) for r in batch)
    idx = torch.zeros((n, longest), dtype=torch.long)  # item indices; padding reads item 0 under a zero mask
    attn = torch.zeros_like(idx)
    tmask = torch.zeros_like(idx, dtype=torch.bool)  # positions whose NEXT item is a target
    for r, row in enumerate(batch):
        idx[r, : len(row)] = torch.as_tensor(row)
        attn[r, : len(row)] = 1
        start = 1 if target_from is None else target_from[r]
        tmask[r, max(start, 1) - 1 : len(row) - 1] = True
    vocab = item_vocab.to(device)
    hidden = decoder(input_ids=vocab[idx.to(device)], attention_mask=attn.to(device), use_cache=False).last_hidden_state
    h = hidden[tmask.to(device)]  # [P, H]
    targets = idx[:, 1:][tmask[:, :-1]].to(device)  # item indices of the next items
    logits = h @ head.weight[vocab].T  # [P, I]: the softmax runs over the item tokens only
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[vocab]
    loss = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    hits = 0
    if with_hits:
        with torch.no_grad():
            tgt = logits.gather(1, targets[:, None])
            hits = int(((logits > tgt).sum(1) < 10).sum())
    return loss, int(targets.numel()), hits


def pretrain_next_item(
    model,
    tokenizer,
    train_sequences: Mapping[int, Sequence[int]],
    val_pairs: Mapping[int, tuple[Sequence[int], Sequence[int]]],
    *,
    item_ids: Sequence[int],
    epochs: int,
    learning_rate: float,
    batch_size: int,
    max_length: int,
    patience: int,
    weight_decay: float = 0.0,
    seed: int = 0,
    log_metric: Callable[[str, float, int], None] | None = None,
) -> PretrainResult:
    """Stage 1 (Eq. next-item) on ``model`` in place: ``train_sequences`` user -> item ids x_{1:T};
    ``val_pairs`` user -> (context x_{1:T}, next items x_{T+1..}) of the validation users; ``item_ids`` the catalog
    (the softmax runs over all of its item tokens). Returns the losses; the
    model ends with the weights of the best validation epoch. ``log_metric(name, value, epoch)`` is called per
    epoch (e.g. mlflow.log_metric)."""
    t0 = time.time()
    catalog = sorted({int(i) for i in item_ids})
    item_vocab = item_vocabulary(tokenizer, catalog)
    index_of = {item: k for k, item in enumerate(catalog)}  # rows hold item indices into item_vocab
    train_rows = [[index_of[int(i)] for i in w] for s in train_sequences.values() for w in windows(s, max_length)]
    val_rows, val_from = [], []
    for ctx, nxt in val_pairs.values():
        if not nxt:
            continue
        seq = [*ctx, *nxt][-max_length:]
        k = min(len(nxt), len(seq) - 1)
        if k <= 0:
            continue
        val_rows.append([index_of[int(i)] for i in seq])
        val_from.append(len(seq) - k)
    n_train = sum(len(r) - 1 for r in train_rows)
    n_val = sum(len(r) - f for r, f in zip(val_rows, val_from))
    res = PretrainResult(epochs_run=0, best_epoch=0, n_train_positions=n_train, n_val_positions=n_val)
    if not train_rows or epochs <= 0:
        res.seconds = time.time() - t0
        return res
    if torch.cuda.is_available() and next(model.parameters()).device.type == "cpu":
        model.to("cuda")  # stage 2's Trainer trains on the GPU where there is one: so does stage 1
    decoder, head = _decoder_and_head(model)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=learning_rate, weight_decay=weight_decay
    )
    rng = np.random.default_rng(seed)
    gen = torch.random.fork_rng()
    best, best_state, bad = math.inf, None, 0
    n_steps = epochs * math.ceil(len(train_rows) / batch_size)
    warm = max(1, n_steps // 50)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 0.5 * (1 + math.cos(math.pi * min(s, n_steps) / n_steps)))
    )

    def validate() -> tuple[float, float]:
        if not val_rows:
            return math.nan, math.nan
        model.eval()
        tot, cnt, hits = 0.0, 0, 0
        with torch.no_grad():
            for b in _batches(val_rows, batch_size, None):
                loss, n, h = next_item_loss(
                    decoder, head, item_vocab, [val_rows[i] for i in b], [val_from[i] for i in b], with_hits=True
                )
                tot, cnt, hits = tot + float(loss), cnt + n, hits + h
        model.train()
        return tot / max(cnt, 1), hits / max(cnt, 1)

    with gen:
        torch.manual_seed(seed)
        model.train()
        for epoch in range(1, epochs + 1):
            te = time.time()
            tot, cnt = 0.0, 0
            for b in _batches(train_rows, batch_size, rng):
                loss, n, _ = next_item_loss(decoder, head, item_vocab, [train_rows[i] for i in b])
                opt.zero_grad(set_to_none=True)
                (loss / max(n, 1)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                tot, cnt = tot + float(loss.detach()), cnt + n
            vl, hr = validate()
            res.epochs_run = epoch
            res.train_losses.append(tot / max(cnt, 1))
            res.val_losses.append(vl)
            res.val_hr10.append(hr)
            if log_metric is not None:
                log_metric("pretrain_train_loss", res.train_losses[-1], epoch)
                if not math.isnan(vl):
                    log_metric("pretrain_val_loss", vl, epoch)
                    log_metric("pretrain_val_hr_at_10", hr, epoch)
            log.info(
                f"pretrain: epoch {epoch}/{epochs} train loss {res.train_losses[-1]:.3f} validation loss "
                f"{vl:.3f} HR@10 (all items) {hr:.3f} ({time.time() - te:.1f}s)"
            )
            if math.isnan(vl) or vl < best - 1e-4:
                best, bad, res.best_epoch = (vl if not math.isnan(vl) else best), 0, epoch
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad += 1
                if bad >= patience:
                    log.info(
                        f"pretrain: validation loss has not improved for {patience} epochs; keeping epoch "
                        f"{res.best_epoch}"
                    )
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    res.seconds = time.time() - t0
    return res
