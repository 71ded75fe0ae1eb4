"""Popularity ranker: score(a) = log(1 + count of a in the training interactions), the same for every user.

``window``: count only each user's last ``window`` interactions (0 = all): a rolling window when the sequences
are "interactions and clicks to date". Ties (equal counts) keep the candidate order's stability: scores are
equal, and the rank metrics count ties against the target, so a tie never helps the ranker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


class PopularityRanker:
    name = "popularity"
    FILES = ()  # save writes nothing beside ranker.json

    def __init__(self, window: int = 0):
        if window < 0:
            raise ValueError(f"PopularityRanker: window {window}; rule: >= 0 (0 = every interaction)")
        self.window = window
        self.counts: Counter[int] = Counter()

    def fit(self, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]) -> PopularityRanker:
        self.counts = Counter()
        for seq in sequences.values():
            self.counts.update(int(i) for i in (seq[-self.window :] if self.window else seq))
        return self

    def score(self, requests) -> list[np.ndarray]:
        return [
            np.log1p(np.array([self.counts.get(int(c), 0) for c in cands], dtype=np.float64))
            for _, _, cands in requests
        ]

    def save(self, out: Path) -> dict:
        """Write nothing beside the metadata: the counts are small; returns the ``ranker.json`` fields."""
        return {"window": self.window, "counts": {str(k): int(v) for k, v in sorted(self.counts.items())}}

    @classmethod
    def load(cls, path: Path, meta: dict) -> PopularityRanker:
        r = cls(window=int(meta["window"]))
        r.counts = Counter({int(k): int(v) for k, v in meta["counts"].items()})
        return r
