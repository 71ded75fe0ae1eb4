"""Stable assignment of users to arms: u = first 64 bits of sha256("<salt>:<user id>") / 2^64, uniform on [0, 1),
and the arm whose interval of the cumulative shares (arms in the order given) contains u. The same user stays in
the same arm for a given salt and shares; a new salt reshuffles everyone."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence


def unit_hash(salt: str, user_id: int) -> float:
    digest = hashlib.sha256(f"{salt}:{int(user_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_shares(shares: Mapping[str, float], arms: Sequence[str]) -> dict[str, float]:
    """The shares of ``arms`` (config report.arm_shares): each in (0, 1], summing to 1."""
    missing = [a for a in arms if a not in shares]
    if missing:
        raise ValueError(f"config report.arm_shares: no share for arm(s) {missing}; rule: every served arm has one")
    out = {a: float(shares[a]) for a in arms}
    bad = {a: s for a, s in out.items() if not 0 < s <= 1}
    if bad:
        raise ValueError(f"config report.arm_shares: {bad}; rule: each share in (0, 1]")
    if not math.isclose(sum(out.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"config report.arm_shares over arms {list(arms)} sum to {sum(out.values()):.6f}; rule: 1")
    return out


def assign_arm(user_id: int, salt: str, shares: Mapping[str, float]) -> str:
    """The arm of ``user_id`` (``shares``: arm -> share, already checked, in a fixed order)."""
    u = unit_hash(salt, user_id)
    acc = 0.0
    arms = list(shares)
    for arm in arms:
        acc += shares[arm]
        if u < acc:
            return arm
    return arms[-1]  # u within rounding of 1


def assign_users(user_ids: Sequence[int], salt: str, shares: Mapping[str, float]) -> dict[int, str]:
    return {int(u): assign_arm(u, salt, shares) for u in user_ids}
