"""The experiment's unit of randomisation: users are assigned to arms by a salted hash. u = first 64 bits of
sha256("<salt>:<user id>") / 2^64, uniform on [0, 1), and the arm whose interval of the cumulative shares (arms in
the order given) contains u. The same user stays in the same arm for a given salt and shares; a new salt
reshuffles everyone.

The simulator's router serves with it (abpo.sim.simulator imports it from here) and the A/B report checks every
logged user against it (sql/report_assignment.sql computes the same hash inside DuckDB; a test holds the two equal),
so both sides read one definition."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence


def unit_hash(salt: str, user_id: int) -> float:
    digest = hashlib.sha256(f"{salt}:{int(user_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def series_salt(salt: str, replicate: int) -> str:
    """The salt of a simulated series: ``salt`` (config ``sim.salt``), or ``<salt>/replicate-<r>`` for replicate
    r = ``sim.replicate`` >= 1 (abpo loop-experiment's replicates)."""
    r = int(replicate)
    if r < 0:
        raise ValueError(f"config sim.replicate = {r}: rule: >= 0 (0: the series itself)")
    return salt if r == 0 else f"{salt}/replicate-{r}"


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


def cumulative_bounds(shares: Mapping[str, float]) -> list[float]:
    """The upper end of each arm's interval of u, accumulated in the order of ``shares`` exactly as
    :func:`assign_arm` accumulates them (so a hash computed elsewhere compares against the same floats)."""
    acc, out = 0.0, []
    for arm in shares:
        acc += shares[arm]
        out.append(acc)
    return out


def assign_arm(user_id: int, salt: str, shares: Mapping[str, float]) -> str:
    """The arm of ``user_id`` (``shares``: arm -> share, already checked, in a fixed order)."""
    u = unit_hash(salt, user_id)
    arms = list(shares)
    for arm, upper in zip(arms, cumulative_bounds(shares)):
        if u < upper:
            return arm
    return arms[-1]  # u within rounding of 1


def assign_users(user_ids: Sequence[int], salt: str, shares: Mapping[str, float]) -> dict[int, str]:
    return {int(u): assign_arm(u, salt, shares) for u in user_ids}
