"""Stratified SNIPS mini-batches (docs/ABPO_SPEC.md step 3): which row of each stratum (B_1 positive, B_0
no-response) fills which slot of which mini-batch, as integers (:func:`stratified_batch_plan`), and the batches
themselves over in-memory strata (:func:`stratified_batch_tables`, :func:`stratified_batches`).

Only numpy and Arrow: the warehouse streams the same batches from DuckDB
(:meth:`abpo.warehouse.Warehouse.stratified_batch_stream`, over this plan) and the update's dataset builds them
from the strata it reads (abpo/train/dataset.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# How the batches are filled (config update.stratification, whose choices these are): see stratified_batch_plan
STRATIFICATIONS = ("oversample", "proportional")


def _as_table(rows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))


@dataclass(frozen=True)
class BatchPlan:
    """Which row of each stratum fills which slot of which mini-batch (:func:`stratified_batch_plan`).

    ``pos_rank[i]`` is a position in the positive stratum's stable order (month, impression_id) and goes to slot
    ``pos_slot[i]`` of batch ``pos_batch[i]``; likewise ``neg_*`` for the no-response stratum. Both ``*_batch``
    arrays are non-decreasing; in every batch the positives take the first slots, the no-response rows the rest.
    Only integers: a plan for 10M rows is ~130 MB, the rows themselves stay where they are (Arrow or DuckDB)."""

    batch_size: int
    n_batches: int
    pos_rank: np.ndarray
    pos_batch: np.ndarray
    pos_slot: np.ndarray
    neg_rank: np.ndarray
    neg_batch: np.ndarray
    neg_slot: np.ndarray
    rows_not_in_batches: int = 0  # proportional mode: the (P + N) mod batch_size rows that fill no batch

    def stratum(self, positive: bool) -> pa.Table:
        """(rank, batch, slot) of one stratum as an Arrow table (what the warehouse joins its rows to)."""
        r, b, s = (
            (self.pos_rank, self.pos_batch, self.pos_slot)
            if positive
            else (self.neg_rank, self.neg_batch, self.neg_slot)
        )
        return pa.table(
            {"rank": pa.array(r, pa.int64()), "batch": pa.array(b, pa.int64()), "slot": pa.array(s, pa.int16())}
        )


def stratified_batch_plan(P: int, N: int, batch_size: int, seed: int, mode: str = "oversample") -> BatchPlan:
    """The mini-batches of docs/ABPO_SPEC.md step 3 (each holds both strata: the SNIPS weight is self-normalised inside
    B_1 and B_0 of every mini-batch) for P positive and N no-response rows, as integers only.

    ``mode="oversample"`` (default): every batch holds k = clamp(round(batch_size * P / (P + N)), 1, batch_size - 1)
    positive rows and batch_size - k no-response rows, so the strata keep their overall proportion. One pass (an epoch)
    covers every row of both strata at least once, in a seeded shuffled order; the number of batches is
    max(ceil(P / k), ceil(N / (batch_size - k))). The stratum that runs out first is NOT dropped and no batch goes
    without it: it is recycled in a fresh seeded shuffle, so some of its rows appear twice in the epoch (rows are never
    silently dropped, and a short last batch never happens).

    ``mode="proportional"`` uses every row at most once instead: floor((P + N) / batch_size) batches, the positives
    spread as evenly as the count allows (each batch gets floor or ceil of P / n_batches), the rest no-response rows;
    the (P + N) mod batch_size rows that fill no batch are left out and counted (``rows_not_in_batches``). It raises
    ValueError when a stratum has fewer rows than there are batches (some batch would lack it).

    An empty stratum or a batch_size below 2 raises ValueError: no batch could hold both strata."""
    if batch_size < 2:
        raise ValueError(f"batch_size={batch_size}: a batch holding both strata needs at least 2 rows")
    if P == 0 or N == 0:
        empty = "positive" if P == 0 else "no-response"
        raise ValueError(f"the {empty} stratum is empty: no mini-batch can hold both strata (P={P}, N={N})")
    if mode not in STRATIFICATIONS:
        raise ValueError(f"stratified_batches: mode {mode!r}; rule: {' | '.join(STRATIFICATIONS)}")
    rng = np.random.default_rng([int(seed), 0x57A7])
    if mode == "oversample":
        k = min(max(int(round(batch_size * P / (P + N))), 1), batch_size - 1)
        n_batches = max(-(-P // k), -(-N // (batch_size - k)))

        def stream(n: int, need: int) -> np.ndarray:
            """``need`` indices: seeded permutations of range(n) back to back (recycling after n)."""
            reps = -(-need // n)
            return np.concatenate([rng.permutation(n) for _ in range(reps)])[:need]

        pos_rank = stream(P, n_batches * k)
        neg_rank = stream(N, n_batches * (batch_size - k))
        pos_counts = np.full(n_batches, k)
        unused = 0
    else:
        n_batches = (P + N) // batch_size
        if n_batches == 0 or P < n_batches or N < n_batches:
            raise ValueError(
                f"proportional stratification: P={P} positive and N={N} no-response rows in batches of {batch_size} "
                f"make {n_batches} batch(es); rule: each stratum needs at least one row per batch (use "
                "mode='oversample')"
            )
        pos_counts = np.full(n_batches, P // n_batches)
        pos_counts[: P % n_batches] += 1
        pos_counts = np.minimum(pos_counts, batch_size - 1)  # leave room for a no-response row
        if int((batch_size - pos_counts).sum()) > N:
            raise ValueError(
                f"proportional stratification: {N} no-response rows cannot fill {n_batches} batches of "
                f"{batch_size} next to {P} positives; rule: use mode='oversample'"
            )
        pos_rank, neg_rank = rng.permutation(P), rng.permutation(N)
        pos_rank = pos_rank[: int(pos_counts.sum())]
        neg_rank = neg_rank[: int((batch_size - pos_counts).sum())]
        unused = P + N - n_batches * batch_size
    neg_counts = batch_size - pos_counts
    pos_batch = np.repeat(np.arange(n_batches, dtype=np.int64), pos_counts)
    neg_batch = np.repeat(np.arange(n_batches, dtype=np.int64), neg_counts)
    pos_slot = (np.arange(pos_batch.size) - np.repeat(np.cumsum(pos_counts) - pos_counts, pos_counts)).astype(np.int16)
    neg_slot = (
        np.arange(neg_batch.size)
        - np.repeat(np.cumsum(neg_counts) - neg_counts, neg_counts)
        + np.repeat(pos_counts, neg_counts)
    ).astype(np.int16)
    return BatchPlan(
        batch_size,
        int(n_batches),
        pos_rank.astype(np.int64),
        pos_batch,
        pos_slot,
        neg_rank.astype(np.int64),
        neg_batch,
        neg_slot,
        rows_not_in_batches=int(unused),
    )


def stratified_batch_tables(
    positive: pa.Table | Sequence[dict],
    no_response: pa.Table | Sequence[dict],
    batch_size: int,
    seed: int,
    mode: str = "oversample",
    *,
    chunk_batches: int = 4096,
) -> Iterator[pa.Table]:
    """The mini-batches of :func:`stratified_batch_plan` as Arrow tables, each holding ``chunk_batches`` whole batches:
    the strata's columns plus ``batch`` and ``slot``, ordered by (batch, slot). Arrow ``take`` only, no per-row Python
    objects (the hot path of a big month; :meth:`Warehouse.stratified_batch_stream` does the same from the warehouse
    without holding the strata in memory)."""
    pos, neg = _as_table(positive).combine_chunks(), _as_table(no_response).combine_chunks()  # take on one chunk
    plan = stratified_batch_plan(pos.num_rows, neg.num_rows, batch_size, seed, mode)
    for b0 in range(0, plan.n_batches, chunk_batches):
        b1 = min(b0 + chunk_batches, plan.n_batches)
        parts = []
        for table, rank, batch, slot in (
            (pos, plan.pos_rank, plan.pos_batch, plan.pos_slot),
            (neg, plan.neg_rank, plan.neg_batch, plan.neg_slot),
        ):
            lo, hi = np.searchsorted(batch, [b0, b1])
            parts.append(
                table.take(pa.array(rank[lo:hi]))
                .append_column("batch", pa.array(batch[lo:hi], pa.int64()))
                .append_column("slot", pa.array(slot[lo:hi], pa.int16()))
            )
        both = pa.concat_tables(parts)
        order = np.lexsort((both.column("slot").to_numpy(), both.column("batch").to_numpy()))
        yield both.take(pa.array(order))


def stratified_batches(
    positive: pa.Table | Sequence[dict],
    no_response: pa.Table | Sequence[dict],
    batch_size: int,
    seed: int,
    mode: str = "oversample",
) -> Iterator[list[dict]]:
    """:func:`stratified_batch_tables` as lists of row dicts, one list per mini-batch (positives first): the form the
    update's tokenising step consumes (see :func:`stratified_batch_plan` for what goes in each batch)."""
    for chunk in stratified_batch_tables(positive, no_response, batch_size, seed, mode, chunk_batches=2048):
        batch = chunk.column("batch").to_numpy()
        rows = chunk.drop_columns(["batch", "slot"]).to_pylist()
        bounds = np.flatnonzero(np.diff(batch)) + 1
        for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(rows)]]), strict=True):
            yield rows[lo:hi]
