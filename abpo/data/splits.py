"""Per-user sequence splits of docs/ABPO_SPEC.md "Offline construction".

A user's chronological sequence x_1..x_{T+N} is cut into
    history  x_{1:T}          -> D_sup (the initial policy's SFT data)
    update   x_{T+1..T+N-1}   -> the positives of the bandit requests t' in {T..T+N-2}
    target   x_{T+N}          -> held out for evaluation, never in any training candidate set
with N - 1 = data.update_steps, i.e. the last update_steps + 1 items are update + target.

Users that cannot be split are skipped and counted by reason in the SplitReport (never dropped
silently): too few items for T >= data.min_history, a target the user had already interacted with
earlier (it would then be a training positive), too few never-interacted items to fill a candidate
set, or not drawn when data.max_users caps the user count.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

SKIP_TOO_SHORT = "too_short"
SKIP_TARGET_SEEN = "target_seen_before"
SKIP_TOO_FEW_UNSEEN = "too_few_unseen_items"
SKIP_NOT_SAMPLED = "not_sampled_max_users"


@dataclass(frozen=True)
class UserSplit:
    user_id: int
    history: list[int]  # x_{1:T}
    update: list[int]  # x_{T+1..T+N-1}
    target: int  # x_{T+N}

    @property
    def sequence(self) -> list[int]:
        """x_{1:T+N}."""
        return [*self.history, *self.update, self.target]


@dataclass
class SplitReport:
    users_total: int = 0
    users_kept: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> users
    skipped_users: dict[str, list[int]] = field(default_factory=dict)  # reason -> user ids (ascending)
    history_items: int = 0  # sum of T over kept users
    update_items: int = 0
    min_history: int = 0
    update_steps: int = 0

    def as_dict(self) -> dict:
        return {
            "users_total": self.users_total,
            "users_kept": self.users_kept,
            "users_skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "history_items": self.history_items,
            "update_items": self.update_items,
            "targets": self.users_kept,
            "min_history": self.min_history,
            "update_steps": self.update_steps,
        }

    def __str__(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        return (
            f"users: {self.users_total} total, {self.users_kept} kept, {sum(self.skipped.values())} skipped "
            f"({reasons}); history items {self.history_items}, update items {self.update_items}, "
            f"targets {self.users_kept}"
        )


def split_users(dataset, data_cfg) -> tuple[list[UserSplit], SplitReport]:
    """Split every user of ``dataset`` (ascending user_id) per the module docstring.

    Uses data_cfg.min_history, update_steps, train_candidates, eval_candidates, max_users, seed.
    """
    n_after = data_cfg.update_steps + 1  # N: update items + the target
    if data_cfg.update_steps < 1:
        raise ValueError(f"data.update_steps={data_cfg.update_steps}: need at least one bandit request per user")
    if data_cfg.min_history < 1:
        raise ValueError(f"data.min_history={data_cfg.min_history}: the initial history needs at least one item")
    n_catalog = dataset.catalog.num_rows
    need_unseen = max(data_cfg.train_candidates, data_cfg.eval_candidates) - 1
    report = SplitReport(min_history=data_cfg.min_history, update_steps=data_cfg.update_steps)
    users = sorted(dataset.sequences)
    report.users_total = len(users)
    skipped: dict[str, list[int]] = {}

    if data_cfg.max_users and data_cfg.max_users < len(users):
        rng = np.random.default_rng([data_cfg.seed, 0x5E1EC7])
        chosen = set(rng.choice(np.asarray(users), size=data_cfg.max_users, replace=False).tolist())
        skipped[SKIP_NOT_SAMPLED] = [u for u in users if u not in chosen]
        users = [u for u in users if u in chosen]

    splits = []
    for u in users:
        seq = dataset.sequences[u]
        if len(seq) - n_after < data_cfg.min_history:
            skipped.setdefault(SKIP_TOO_SHORT, []).append(u)
            continue
        target = seq[-1]
        if target in seq[:-1]:
            skipped.setdefault(SKIP_TARGET_SEEN, []).append(u)
            continue
        if n_catalog - len(set(seq)) < need_unseen:
            skipped.setdefault(SKIP_TOO_FEW_UNSEEN, []).append(u)
            continue
        t = len(seq) - n_after
        splits.append(UserSplit(user_id=u, history=list(seq[:t]), update=list(seq[t:-1]), target=target))
        report.history_items += t
        report.update_items += n_after - 1

    report.users_kept = len(splits)
    report.skipped_users = {k: sorted(v) for k, v in sorted(skipped.items())}
    report.skipped = Counter({k: len(v) for k, v in report.skipped_users.items()})
    return splits, report


VALIDATION_SALT = "abpo-experiment-users"


def split_of_user(user_id: int, validation_fraction: float) -> str:
    """'validation' or 'test' for a user: a salted SHA-256 of the id, fixed across seeds and reruns. Settings are
    chosen on the validation users only (the experiment's sweep, pi_init's early stopping), never on test targets."""
    h = hashlib.sha256(f"{VALIDATION_SALT}:{int(user_id)}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return "validation" if u < validation_fraction else "test"
