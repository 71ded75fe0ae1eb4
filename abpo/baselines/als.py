"""ML-retrain: implicit-feedback matrix factorisation (implicit's ``AlternatingLeastSquares``), retrained from
scratch on the interactions to date.

implicit 0.7.3 installs cleanly (a wheel, numpy/scipy only) and is a well-kept, widely used library. The
sequential alternative is SASRec-CE (abpo.baselines.sasrec, ``arms.ml_retrain.kind: sasrec``), written in torch
because neither RecTools nor RecBole installs against the pins.

The user side is recomputed from the request's history at scoring time (``recalculate_user``: one ALS half-step
against the fitted item factors), so the model scores a user from everything the prompt of an LLM row shows
(x_{1:t}), also the interactions after the fit. Items never seen in training keep their initial factors; users are
never cold (the history is the user). Deterministic for a seed (one thread, ``random_state``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


class ALSRanker:
    name = "ml_retrain"
    FILES = ("als.npz",)  # what save writes beside ranker.json (a version without them is not complete)
    DEFAULT_ITERATIONS = 15

    def __init__(
        self,
        *,
        factors: int = 64,
        regularization: float = 0.05,
        alpha: float = 1.0,
        iterations: int = DEFAULT_ITERATIONS,
        seed: int = 0,
    ):
        self.params = dict(factors=factors, regularization=regularization, alpha=alpha, iterations=iterations)
        self.seed = int(seed)
        self.model = None
        self.index: dict[int, int] = {}

    def _rows(self, seqs: Sequence[Sequence[int]]):
        from scipy.sparse import csr_matrix

        data, rows, cols = [], [], []
        for r, seq in enumerate(seqs):
            counts: dict[int, float] = {}
            for i in seq:
                j = self.index.get(int(i))
                if j is not None:
                    counts[j] = counts.get(j, 0.0) + 1.0
            rows += [r] * len(counts)
            cols += list(counts)
            data += list(counts.values())
        return csr_matrix((np.array(data, dtype=np.float32), (rows, cols)), shape=(len(seqs), len(self.index)))

    def fit(self, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]) -> ALSRanker:
        from implicit.cpu.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits

        self.index = {int(i): j for j, i in enumerate(item_ids)}
        users = sorted(sequences)
        unknown = sorted({int(i) for u in users for i in sequences[u]} - set(self.index))
        if unknown:
            raise ValueError(f"ALSRanker.fit: item ids {unknown[:5]} are not in the catalog")
        matrix = self._rows([sequences[u] for u in users])
        with threadpool_limits(1):  # one BLAS thread: deterministic, and what implicit asks for
            self.model = AlternatingLeastSquares(
                **self.params, num_threads=1, random_state=self.seed, calculate_training_loss=False
            )
            self.model.fit(matrix, show_progress=False)
        return self

    def score(self, requests) -> list[np.ndarray]:
        if self.model is None:
            raise RuntimeError("ALSRanker.score: fit first")
        from threadpoolctl import threadpool_limits

        items = np.asarray(self.model.item_factors)
        out = []
        with threadpool_limits(1):
            for _, history, cands in requests:
                user = np.asarray(self.model.recalculate_user(0, self._rows([history]))).reshape(-1)
                idx = [self.index.get(int(c)) for c in cands]
                if any(j is None for j in idx):
                    missing = [c for c, j in zip(cands, idx) if j is None][:5]
                    raise ValueError(f"ALSRanker.score: candidate ids {missing} are not in the catalog")
                out.append(items[idx] @ user)
        return [np.asarray(s, dtype=np.float64) for s in out]

    def save(self, out: Path) -> dict:
        """Write ``als.npz`` (implicit's own format) into ``out``; returns the ``ranker.json`` fields."""
        if self.model is None:
            raise ValueError(f"save_ranker({out}): the ALS ranker is not fitted")
        self.model.save(str(out / "als.npz"))
        return {
            "params": self.params,
            "seed": self.seed,
            "item_ids": [i for i, _ in sorted(self.index.items(), key=lambda kv: kv[1])],
        }

    @classmethod
    def load(cls, path: Path, meta: dict) -> ALSRanker:
        from implicit.cpu.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits

        r = cls(**meta["params"], seed=int(meta["seed"]))
        # loading builds a model, whose constructor checks the BLAS threads once per process (implicit warned, in a
        # fresh serve task, that OpenBLAS used more than one): one thread, as fit and score use
        with threadpool_limits(1, "blas"):
            r.model = AlternatingLeastSquares.load(str(path / "als.npz"))
        r.index = {int(i): j for j, i in enumerate(meta["item_ids"])}
        return r
