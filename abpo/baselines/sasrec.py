"""SASRec-CE: a causal self-attention sequential recommender trained with the full softmax cross-entropy over the
catalog, the baseline a recommender engineer reaches for first.

Model (Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018): item embeddings E (tied input and
output, one row per catalog item plus a padding row), learned position embeddings P, ``blocks`` pre-LayerNorm
Transformer blocks (multi-head causal self-attention and a point-wise feed-forward of the hidden size, residuals,
dropout), a final LayerNorm. The hidden state h_t after items x_1..x_t scores item i as r(i | x_{1:t}) = h_t . E_i.

Loss (Eq. CE), the change from the original's one-negative binary cross-entropy that Klenitskiy & Vasilev ("Turning
Dross Into Gold Loss: is BERT4Rec really better than SASRec?", RecSys 2023) and Petrov & Macdonald ("gSASRec:
Reducing Overconfidence in Sequential Recommendation Trained with Negative Sampling", RecSys 2023) showed makes
SASRec far stronger (SASRec-CE):

    L = - mean over training positions (u, t) of  log softmax_{i in catalog}( h_t . E_i )[x_{t+1}]

the softmax over every item of the catalog (no negative sampling), as pi_init's stage 1 (abpo.policy.pretrain,
Eq. next-item) trains the LLM's item tokens, so the two rows differ in the model, not in the objective.

Data, as pi_init's stage 1: every user's training sequence (x_{1:T} offline) is cut into windows of ``max_length``
items overlapping by one, so each transition is trained once per epoch; positions count from the window's start
(GPT-style: the prediction after t items of a window sees positions 0..t-1, as scoring the last t items of a
history does). Padding is on the right and the mask causal, so a real position never attends to padding.
Early stopping (optional ``validation``: user -> (context, next items), pi_init's stage-1 pairs x_{1:T} ->
x_{T+1..T+N-1} of the validation users): the validation loss of Eq. CE on the next items after every epoch; after
``patience`` epochs without improvement the best epoch's weights are kept. Without validation it trains ``epochs``.
Warm start (``fit(..., init=previous)``): the previous model's weights, item rows matched by item id, then ``epochs``
more (the ML-retrain arm's monthly refit).

Scoring: the last ``max_length`` history items of the request, h at the last one, the candidates' E rows. An empty
history reads the padding row alone (the same scores for every such user). Deterministic on the CPU for a seed
(``torch.manual_seed`` inside a forked RNG, a seeded numpy generator for the batch order, ``num_threads`` torch
threads set while it runs and restored after).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from abpo.baselines import RANKER_FILE

log = logging.getLogger(__name__)

WEIGHTS_FILE = "sasrec.pt"


@dataclass
class FitReport:
    epochs_run: int = 0
    best_epoch: int = 0  # 1-based; 0 = no epoch improved on the starting weights (or no validation)
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    val_hr10: list[float] = field(default_factory=list)  # the next item in the top 10 of the whole catalog
    n_train_positions: int = 0
    n_val_positions: int = 0
    seconds: float = 0.0
    warm_started: bool = False


@contextlib.contextmanager
def torch_threads(n: int):
    """``torch.set_num_threads(n)`` while inside (n = 0: unchanged), restored after."""
    import torch

    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _module(n_items: int, max_length: int, hidden: int, blocks: int, heads: int, dropout: float):
    import torch
    from torch import nn

    class SASRecModule(nn.Module):
        """Kang & McAuley 2018's SASRec (pre-LN blocks, tied item embeddings); item index 0 is padding."""

        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(n_items + 1, hidden, padding_idx=0)
            self.positions = nn.Embedding(max_length, hidden)
            self.drop = nn.Dropout(dropout)
            layer = nn.TransformerEncoderLayer(
                hidden, heads, dim_feedforward=hidden, dropout=dropout, activation="relu", batch_first=True,
                norm_first=True,
            )  # fmt: skip
            self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(hidden)
            nn.init.normal_(self.items.weight, std=hidden**-0.5)
            with torch.no_grad():
                self.items.weight[0].zero_()

        def forward(self, idx):  # idx [B, L] item indices, right-padded with 0 -> hidden states [B, L, H]
            n = idx.shape[1]
            x = self.items(idx) * math.sqrt(hidden) + self.positions(torch.arange(n, device=idx.device))[None]
            mask = torch.triu(torch.full((n, n), float("-inf"), device=idx.device), diagonal=1)
            return self.norm(self.blocks(self.drop(x), mask=mask, is_causal=True))

        def logits(self, h):  # [P, H] -> [P, n_items] over the catalog (padding row excluded)
            return h @ self.items.weight[1:].T

    return SASRecModule()


def windows(sequence: Sequence[int], length: int) -> list[list[int]]:
    """``sequence`` cut into windows of at most ``length`` items overlapping by one (each transition once)."""
    seq = list(sequence)
    if len(seq) < 2:
        return []
    return [seq[s : s + length] for s in range(0, len(seq) - 1, length - 1)]


class SASRecRanker:
    name = "sasrec"
    FILES = (WEIGHTS_FILE,)  # what save writes beside ranker.json (a version without them is not complete)

    def __init__(
        self,
        *,
        max_length: int = 50,
        blocks: int = 2,
        heads: int = 1,
        hidden_size: int = 64,
        dropout: float = 0.2,
        epochs: int = 100,
        patience: int = 3,
        learning_rate: float = 1e-3,
        batch_size: int = 32,
        num_threads: int = 1,
        seed: int = 0,
    ):
        rules = {
            "max_length": (max_length >= 2, ">= 2"),
            "blocks": (blocks >= 1, ">= 1"),
            "heads": (heads >= 1 and hidden_size % heads == 0, ">= 1 and dividing hidden_size"),
            "hidden_size": (hidden_size >= 2, ">= 2"),
            "dropout": (0 <= dropout < 1, "in [0, 1)"),
            "epochs": (epochs >= 1, ">= 1"),
            "patience": (patience >= 1, ">= 1"),
            "learning_rate": (learning_rate > 0, "> 0"),
            "batch_size": (batch_size >= 1, ">= 1"),
            "num_threads": (num_threads >= 0, ">= 0"),
        }
        for key, (ok, rule) in rules.items():
            if not ok:
                raise ValueError(f"SASRecRanker: sasrec.{key} = {locals()[key]!r}; rule: {rule}")
        self.params: dict[str, Any] = dict(
            max_length=max_length, blocks=blocks, heads=heads, hidden_size=hidden_size, dropout=dropout,
            epochs=epochs, patience=patience, learning_rate=learning_rate, batch_size=batch_size,
            num_threads=num_threads,
        )  # fmt: skip
        self.seed = int(seed)
        self.model: Any = None
        self.index: dict[int, int] = {}  # item id -> 1-based row of the embedding (0 = padding)
        self.report = FitReport()

    @classmethod
    def from_config(cls, sasrec_cfg, *, seed: int = 0, **overrides: Any) -> SASRecRanker:
        """The ranker of config section ``sasrec`` (abpo.config.sasrec; ``refit_epochs`` is the arm's, not a
        model setting), with ``overrides``."""
        import dataclasses

        params = {k: v for k, v in dataclasses.asdict(sasrec_cfg).items() if k != "refit_epochs"}
        return cls(**{**params, **overrides}, seed=seed)

    def _build(self):
        p = self.params
        return _module(len(self.index), p["max_length"], p["hidden_size"], p["blocks"], p["heads"], p["dropout"])

    def _rows(self, seqs, where: str) -> list[list[int]]:
        out = []
        for s in seqs:
            missing = [i for i in s if int(i) not in self.index][:5]
            if missing:
                raise ValueError(f"SASRecRanker.{where}: item ids {missing} are not in the catalog")
            out.append([self.index[int(i)] for i in s])
        return out

    def _batch_loss(self, rows: list[list[int]], starts: list[int]):
        """Eq. CE summed over the next items of ``rows`` (item rows, right-padded here) from position
        ``starts[r]`` on (1 = every transition), the number of targets and how many are in the top 10."""
        import torch

        n, longest = len(rows), max(len(r) for r in rows)
        idx = torch.zeros((n, longest), dtype=torch.long)
        tmask = torch.zeros((n, longest), dtype=torch.bool)  # positions whose NEXT item is a target
        for r, row in enumerate(rows):
            idx[r, : len(row)] = torch.as_tensor(row)
            tmask[r, max(starts[r], 1) - 1 : len(row) - 1] = True
        h = self.model(idx)[tmask]
        targets = idx[:, 1:][tmask[:, :-1]] - 1  # catalog column of the next item
        logits = self.model.logits(h)
        loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")  # Eq. CE (full softmax)
        with torch.no_grad():
            tgt = logits.gather(1, targets[:, None])
            hits = int(((logits > tgt).sum(1) < 10).sum())
        return loss, int(targets.numel()), hits

    def fit(
        self,
        sequences: Mapping[int, Sequence[int]],
        item_ids: Sequence[int],
        *,
        validation: Mapping[int, tuple[Sequence[int], Sequence[int]]] | None = None,
        init: SASRecRanker | None = None,
        epochs: int | None = None,
    ) -> SASRecRanker:
        """Train on ``sequences`` (user -> chronological item ids) over the catalog ``item_ids``; ``validation``:
        user -> (context, next items) for early stopping; ``init``: a fitted SASRecRanker of the same shape to start
        from (warm start); ``epochs``: this fit's epoch cap instead of the ranker's."""
        import torch

        t0 = time.time()
        p = self.params
        self.index = {int(i): j + 1 for j, i in enumerate(dict.fromkeys(int(i) for i in item_ids))}
        length = p["max_length"]
        train = [w for s in self._rows([sequences[u] for u in sorted(sequences)], "fit") for w in windows(s, length)]
        val_rows, val_from = [], []
        for u in sorted(validation or {}):
            ctx, nxt = validation[u]  # type: ignore[index]
            if not nxt:
                continue
            (seq,) = self._rows([[*ctx, *nxt][-length:]], "fit (validation)")
            k = min(len(nxt), len(seq) - 1)
            if k > 0:
                val_rows.append(seq)
                val_from.append(len(seq) - k)
        rep = FitReport(
            n_train_positions=sum(len(w) - 1 for w in train),
            n_val_positions=sum(len(r) - f for r, f in zip(val_rows, val_from)),
        )
        max_epochs = p["epochs"] if epochs is None else int(epochs)
        bs = p["batch_size"]
        with torch_threads(p["num_threads"]), torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.model = self._build()
            if init is not None:
                self._warm_start(init)
                rep.warm_started = True
            opt = torch.optim.Adam(self.model.parameters(), lr=p["learning_rate"], betas=(0.9, 0.98))
            rng = np.random.default_rng([self.seed, 0x5A5])

            def validate() -> tuple[float, float]:
                self.model.eval()
                tot, cnt, hits = 0.0, 0, 0
                with torch.no_grad():
                    for i in range(0, len(val_rows), bs):
                        loss, n, h = self._batch_loss(val_rows[i : i + bs], val_from[i : i + bs])
                        tot, cnt, hits = tot + float(loss), cnt + n, hits + h
                self.model.train()
                return tot / max(cnt, 1), hits / max(cnt, 1)

            best, best_state, bad = math.inf, None, 0
            if val_rows:
                best, _ = validate()  # the starting weights: a warm start that only gets worse is kept as it was
                best_state = copy.deepcopy(self.model.state_dict())
            order = sorted(range(len(train)), key=lambda i: len(train[i]))  # similar lengths share a batch
            chunks = [order[i : i + bs] for i in range(0, len(order), bs)]
            self.model.train()
            for epoch in range(1, max_epochs + 1 if train else 1):
                rng.shuffle(chunks)
                tot, cnt = 0.0, 0
                for b in chunks:
                    loss, n, _ = self._batch_loss([train[i] for i in b], [1] * len(b))
                    opt.zero_grad(set_to_none=True)
                    (loss / max(n, 1)).backward()
                    opt.step()
                    tot, cnt = tot + float(loss.detach()), cnt + n
                rep.epochs_run = epoch
                rep.train_losses.append(tot / max(cnt, 1))
                if not val_rows:
                    continue
                vl, hr = validate()
                rep.val_losses.append(vl)
                rep.val_hr10.append(hr)
                log.info(f"sasrec epoch {epoch}: train {rep.train_losses[-1]:.4f}, validation {vl:.4f}, HR@10 {hr:.4f}")
                if vl < best - 1e-6:
                    best, best_state, bad, rep.best_epoch = vl, copy.deepcopy(self.model.state_dict()), 0, epoch
                else:
                    bad += 1
                    if bad >= p["patience"]:
                        break
            if best_state is not None:
                self.model.load_state_dict(best_state)
            self.model.eval()
        rep.seconds = time.time() - t0
        self.report = rep
        return self

    def _warm_start(self, init: SASRecRanker) -> None:
        """Copy ``init``'s weights into the fresh model; item rows matched by item id (new items keep their
        initial rows)."""
        if init.model is None:
            raise ValueError("SASRecRanker.fit(init=...): the model to warm-start from is not fitted")
        shape = ("max_length", "blocks", "heads", "hidden_size")
        if any(init.params[k] != self.params[k] for k in shape):
            raise ValueError(
                "SASRecRanker.fit(init=...): the previous model's "
                + ", ".join(f"sasrec.{k} = {init.params[k]}" for k in shape)
                + " differ from this one's "
                + ", ".join(f"{self.params[k]}" for k in shape)
                + "; rule: a warm start keeps the shape (refit from scratch after changing it)"
            )
        state = {k: v.clone() for k, v in init.model.state_dict().items()}
        old = state.pop("items.weight")
        new = self.model.items.weight.detach().clone()
        for item, j in self.index.items():
            i = init.index.get(item)
            if i is not None:
                new[j] = old[i]
        new[0] = 0.0
        state["items.weight"] = new
        self.model.load_state_dict(state)

    def _hidden_last(self, histories: Sequence[Sequence[int]]):
        import torch

        length = self.params["max_length"]
        rows = [r[-length:] if r else [0] for r in self._rows(histories, "score")]
        out = torch.empty((len(rows), self.params["hidden_size"]))
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        bs = max(self.params["batch_size"], 64)
        for s in range(0, len(order), bs):
            b = order[s : s + bs]
            longest = max(len(rows[i]) for i in b)
            idx = torch.zeros((len(b), longest), dtype=torch.long)
            for r, i in enumerate(b):
                idx[r, : len(rows[i])] = torch.as_tensor(rows[i])
            h = self.model(idx)
            last = torch.as_tensor([len(rows[i]) - 1 for i in b])
            out[torch.as_tensor(b)] = h[torch.arange(len(b)), last]
        return out

    def score(self, requests) -> list[np.ndarray]:
        """One score per candidate of each request (user id, history oldest first, candidate ids): h . E_c."""
        if self.model is None:
            raise RuntimeError("SASRecRanker.score: fit first")
        import torch

        requests = list(requests)
        if not requests:
            return []
        with torch_threads(self.params["num_threads"]), torch.no_grad():
            self.model.eval()
            h = self._hidden_last([r[1] for r in requests])
            emb = self.model.items.weight
            out = []
            for k, (_, _, cands) in enumerate(requests):
                (cols,) = self._rows([cands], "score (candidates)")
                out.append((emb[torch.as_tensor(cols, dtype=torch.long)] @ h[k]).double().numpy())
        return out

    def save(self, out: Path) -> dict:
        """Write ``sasrec.pt`` (the state dict) into ``out``; returns the ``ranker.json`` fields."""
        import torch

        if self.model is None:
            raise ValueError(f"save_ranker({out}): the SASRec ranker is not fitted")
        torch.save(self.model.state_dict(), out / WEIGHTS_FILE)
        return {
            "params": self.params,
            "seed": self.seed,
            "item_ids": [i for i, _ in sorted(self.index.items(), key=lambda kv: kv[1])],
            "fit": {k: v for k, v in self.report.__dict__.items() if not isinstance(v, list)},
        }

    @classmethod
    def load(cls, path: Path, meta: dict) -> SASRecRanker:
        """The ranker :meth:`save` wrote into ``path``. A missing ``sasrec.pt`` is FileNotFoundError, one that torch
        cannot read or that does not fit the recorded shape (truncated, damaged, another model's) ValueError, each
        one line naming the file (a registered version's copy is checked before this: abpo.arms.rankers)."""
        import pickle
        import zipfile

        import torch

        f = Path(path) / WEIGHTS_FILE
        if not f.is_file():
            raise FileNotFoundError(
                f"{f}: missing; rule: a SASRec ranker's directory holds {RANKER_FILE} and {WEIGHTS_FILE} "
                "(what save_ranker wrote)"
            )
        r = cls(**meta["params"], seed=int(meta["seed"]))
        r.index = {int(i): j + 1 for j, i in enumerate(meta["item_ids"])}
        r.model = r._build()
        try:
            r.model.load_state_dict(torch.load(f, weights_only=True))
        except (OSError, RuntimeError, EOFError, ValueError, KeyError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
            first = " ".join(str(e).split())[:200]
            raise ValueError(
                f"{f}: not loadable SASRec weights ({type(e).__name__}: {first}); rule: the whole state dict "
                f"save_ranker wrote with this {RANKER_FILE} (its params and {len(r.index)} items)"
            ) from None
        r.model.eval()
        return r
