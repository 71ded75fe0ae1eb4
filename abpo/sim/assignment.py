"""The router's assignment of users to arms: the experiment's salted hash, defined once in
:mod:`abpo.abtest.assignment` (the A/B report checks the logged users against the same function)."""

from __future__ import annotations

from abpo.abtest.assignment import assign_arm, assign_users, check_shares, cumulative_bounds, unit_hash

__all__ = ["assign_arm", "assign_users", "check_shares", "cumulative_bounds", "unit_hash"]
