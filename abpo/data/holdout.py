"""The gate's held-out slice of a deployment's own users (config ``arms.gate_users = warehouse``).

A user is in the slice when u = first 64 bits of sha256("<seed>:gate:<user id>") / 2^64 (uniform on [0, 1), the
form of the simulator's arm assignment, abpo.abtest.assignment.unit_hash, with its own salt) is below
``arms.gate_holdout_fraction``. The rule is a pure function of (seed, user id, fraction): the same user is in the
slice every month, whatever other users arrive, so the gate scores its own users on data no update trained on, and
the update (abpo.train.strata.read_update_strata) leaves exactly these users' impressions out of D_bandit.

The slice is held out of every LLM update when the gate reads it: when its off-policy half (the decision, by
default) reads the held-out users' rows (``arms.gate_ope_rows = heldout``, the default), or when its offline half
scores these users (``arms.gate_users = warehouse``). With ``arms.gate_ope_rows = all`` and ``arms.gate_users =
dataset`` nothing is held out (the gate before the off-policy decision: it then reads rows the update trained on)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

GATE_USERS = ("dataset", "warehouse")  # the values of arms.gate_users
GATE_OPE_ROWS = ("heldout", "all")  # the values of arms.gate_ope_rows


def holdout_unit(seed: int, user_id: int) -> float:
    """u in [0, 1) for ``user_id`` under ``seed``: the first 64 bits of sha256("<seed>:gate:<user id>") / 2^64."""
    digest = hashlib.sha256(f"{int(seed)}:gate:{int(user_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_gate_users(value: str) -> str:
    """``value`` when it is one of GATE_USERS (config arms.gate_users), else ValueError naming the key and the rule."""
    if value not in GATE_USERS:
        raise ValueError(f"arms.gate_users={value!r}; rule: one of {list(GATE_USERS)}")
    return value


def check_gate_ope_rows(value: str) -> str:
    """``value`` when it is one of GATE_OPE_ROWS (config arms.gate_ope_rows), else ValueError naming the key and rule."""
    if value not in GATE_OPE_ROWS:
        raise ValueError(f"arms.gate_ope_rows={value!r}; rule: one of {list(GATE_OPE_ROWS)}")
    return value


def holds_out(gate_users: str, gate_ope_rows: str = "all") -> bool:
    """Whether the updates leave the held-out slice's impressions out (the module docstring): the gate's offline half
    scores those users (``gate_users`` warehouse) or its off-policy half reads their rows (``gate_ope_rows``
    heldout). The caller passes config ``arms.gate_users`` and ``arms.gate_ope_rows``."""
    return check_gate_users(gate_users) == "warehouse" or check_gate_ope_rows(gate_ope_rows) == "heldout"


def check_holdout_fraction(fraction: float) -> float:
    """``fraction`` when it is in (0, 1) (config arms.gate_holdout_fraction), else ValueError naming the key and the
    rule: 0 holds out nobody (no user to gate on), 1 everybody (no user left to update from)."""
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(
            f"arms.gate_holdout_fraction={fraction!r}; rule: a share in (0, 1) (0 leaves the gate no "
            "user, 1 leaves the update none)"
        )
    return float(fraction)


def in_holdout(user_id: int, seed: int, fraction: float) -> bool:
    """Whether ``user_id`` is in the held-out slice (module docstring)."""
    return holdout_unit(seed, user_id) < fraction


def holdout_slice(user_ids: Iterable[int], seed: int, fraction: float) -> list[int]:
    """The users of ``user_ids`` in the held-out slice, ascending and distinct."""
    fraction = check_holdout_fraction(fraction)
    return sorted({int(u) for u in user_ids if in_holdout(int(u), seed, fraction)})


def gate_holdout_users(
    user_ids: Iterable[int], *, seed: int, gate_users: str, fraction: float, gate_ope_rows: str = "all"
) -> list[int]:
    """The users of ``user_ids`` the gate holds out of every LLM update: the slice of ``fraction`` (the config's
    ``arms.gate_holdout_fraction``, with seed ``cfg.seed``) when :func:`holds_out` (``arms.gate_users`` warehouse
    or ``arms.gate_ope_rows`` heldout), none otherwise. The caller passes the arms section's values (the data
    layer reads no higher config section)."""
    if not holds_out(gate_users, gate_ope_rows):
        return []
    return holdout_slice(user_ids, seed, fraction)
