"""Config section `sim`: the traffic simulator that stands in for serving and for the users (abpo.sim).

Traffic shares are not here: the router uses ``report.arm_shares``, the same shares the A/B report's
sample-ratio check expects, so the two can never disagree."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimConfig:
    start_month: str = field(
        default="2026-01",
        metadata={"help": "First simulated month (YYYY-MM): month index 0 serves each user's first requests_per_user "
                          "update positions, the next month the following ones (windows never overlap)."},
    )
    requests_per_user: int = field(
        default=2,
        metadata={"help": "Requests per user per month: the length of each user's monthly window of real later "
                          "interactions. Months available = data.update_steps // requests_per_user."},
    )
    salt: str = field(
        default="abpo-arms-v1",
        metadata={"help": "Salt of the user -> arm hash: the same user stays in the same arm for a given salt."},
    )
    click_next: float = field(
        default=0.7, metadata={"help": "P(click) when the exposed item is the user's true next item."}
    )
    click_soon: float = field(
        default=0.35,
        metadata={"help": "P(click) when the exposed item is among the user's next soon_horizon items after the next "
                          "one (taken a little later: still of interest)."},
    )
    soon_horizon: int = field(default=3, metadata={"help": "How many items after the true next one count as soon."})
    click_base: float = field(
        default=0.01, metadata={"help": "P(click) on any other exposed item before the taste term."}
    )
    click_taste: float = field(
        default=0.06,
        metadata={"help": "Added P(click) on any other item, times its genre overlap with the recent history "
                          "(share of the item's genres seen in the last taste_window items, 0..1)."},
    )
    taste_window: int = field(default=10, metadata={"help": "Recent history items that define the user's taste."})
