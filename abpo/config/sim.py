"""Config section `sim`: the traffic simulator that stands in for serving and for the users (abpo.sim;
docs/loop.md "Simulator" explains every parameter).

Traffic shares are not here: the router uses ``report.arm_shares``, the same shares the A/B report's
sample-ratio check expects, so the two can never disagree."""

from __future__ import annotations

from dataclasses import dataclass, field

# The choices of sim.candidates and sim.oracle, refused at load when anything else (abpo.config.values), and the
# lists abpo.sim dispatches on: a new candidate source or ground truth adds its name here, and its builder in abpo.sim
# (abpo.sim.simulator for the candidates and the components, abpo.sim.preference for an oracle).
CANDIDATE_SOURCES = ("retrieval", "offline")
ORACLE_COMPONENTS = ("knn", "sequential", "als")  # the mixture's components (sim.oracle_weights' keys)
ORACLES = ("mixture", *ORACLE_COMPONENTS, "replay")  # replay: the users' real next items alone, never mixed


@dataclass
class SimConfig:
    start_month: str = field(
        default="2026-01",
        metadata={
            "help": "First simulated month (YYYY-MM): month index 0 is each user's first `window` update "
            "positions, the next month the following ones (windows never overlap)."
        },
    )
    window: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "Real later interactions each user consumes per month (positions of the update segment). "
            "Months available = data.update_steps // window.",
        },
    )
    requests_per_user: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "Requests each user makes per month, spread evenly over the month's window positions (a "
            "position may serve several requests, each with its own candidates). sim.candidates = "
            "offline: must equal window (one request per position).",
        },
    )
    salt: str = field(
        default="abpo-arms-v1",
        metadata={"help": "Salt of the user -> arm hash: the same user stays in the same arm for a given salt."},
    )
    replicate: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Replicate of the simulated series (abpo loop-experiment): 0 = the series itself; r >= 1 "
            "assigns users to arms with the salt '<sim.salt>/replicate-<r>' and draws every month's traffic "
            "(retrieval candidates, exposures, clicks) from generators keyed by that salt too, on the same data, "
            "seed and pi_init.",
        },
    )
    candidates: str = field(
        default="retrieval",
        metadata={
            "choices": CANDIDATE_SOURCES,
            "help": "Where a request's candidates come from: retrieval (a production-like retrieval stage: "
            "co-occurrence top-K + popularity-weighted + uniform draws, the true next item only when "
            "found) or offline (the offline construction: x_{t+1} plus data.train_candidates - 1 "
            "never-seen distractors).",
        },
    )
    candidate_count: int = field(default=20, metadata={"min": 2, "help": "Candidates per request (retrieval)."})
    retrieval_fraction: float = field(
        default=0.5,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Share of the candidates from the co-occurrence retrieval model's top scores.",
        },
    )
    popular_fraction: float = field(
        default=0.3,
        metadata={"min": 0, "max": 1, "help": "Share drawn weighted by popularity to date; the rest is uniform draws."},
    )
    retrieval_window: int = field(
        default=3,
        metadata={"min": 1, "help": "Two items co-occur when a user consumed them at most this many positions apart."},
    )
    retrieval_recent: int = field(
        default=10, metadata={"min": 1, "help": "The user's last items that query the co-occurrence model."}
    )
    base_ctr: float = field(
        default=0.05,
        metadata={
            "min": 0,
            "lt": 1,
            "help": "Calibrated CTR of an arm exposing a uniformly random candidate, before the next-item "
            "boosts: the preference link's intercept is set to give it on each month's requests (0: only the "
            "boosts click).",
        },
    )
    preference_slope: float = field(
        default=0.6,
        metadata={
            "help": "Slope of the preference link: P_pref = sigmoid(b0 + slope * z), z the oracle's score "
            "standardised over the users for the item (personal relevance, not popularity)."
        },
    )
    oracle: str = field(
        default="mixture",
        metadata={
            "choices": ORACLES,
            "help": "The users' ground truth (docs/simulator.md): mixture (sim.oracle_weights over the model "
            "components; knn and sequential by default, als, the ML-retrain arm's family, at weight 0) or one component "
            "alone: knn (co-occurrence with the user's recent items), sequential (a smoothed Markov next-item "
            "model) or als (implicit ALS factors), each fitted on every interaction and standardised per item "
            "over the users; or replay (only the user's real next items lift P_pref, sim.replay_*; no model).",
        },
    )
    oracle_weights: dict[str, float] = field(
        default_factory=lambda: {"knn": 1.0, "sequential": 1.0, "als": 0.0},
        metadata={
            "min": 0,
            "help": "Weights of the mixture oracle's components (knn, sequential, als; each >= 0, normalised "
            "by their sum, which must be > 0; a component left out weighs 0). The default gives als (the ML-retrain "
            "arm's model family) weight 0, so no arm's model is part of the truth (docs/simulator.md); "
            "{knn: 1, sequential: 1, als: 1} is the former default.",
        },
    )
    oracle_factors: int = field(
        default=32, metadata={"min": 1, "help": "Latent factors of the ground truth's ALS component."}
    )
    oracle_iterations: int = field(
        default=20, metadata={"min": 1, "help": "ALS iterations of the ground truth's ALS component."}
    )
    oracle_regularization: float = field(
        default=0.1, metadata={"min": 0, "help": "ALS regularisation of the ground truth's ALS component."}
    )
    oracle_knn_window: int = field(
        default=3,
        metadata={
            "min": 1,
            "help": "knn component: two items co-occur when a user consumed them at most this many "
            "positions apart (counted on every interaction).",
        },
    )
    oracle_knn_recent: int = field(
        default=10,
        metadata={"min": 1, "help": "knn component: the user's last items whose co-occurrence scores an item."},
    )
    oracle_markov_order: int = field(
        default=3,
        metadata={
            "min": 1,
            "help": "sequential component: how many of the user's last items predict the next one "
            "(k-step transitions mixed with weights halving per step back).",
        },
    )
    oracle_markov_smoothing: float = field(
        default=1.0,
        metadata={
            "gt": 0,
            "help": "sequential component: add-alpha smoothing of each transition row towards "
            "the items' popularity (> 0).",
        },
    )
    oracle_reference_users: int = field(
        default=2000,
        metadata={
            "min": 0,
            "help": "Users the knn, sequential and mixture standardisation is taken over: all "
            "users, or a seeded sample of this many on larger data (0: all).",
        },
    )
    replay_horizon: int = field(
        default=10,
        metadata={
            "min": 1,
            "help": "replay oracle: how many of the user's real next items (never the held-out target) lift "
            "P_pref; the rest of the catalog keeps the base rate.",
        },
    )
    replay_decay: float = field(
        default=0.7,
        metadata={
            "gt": 0,
            "max": 1,
            "help": "replay oracle: the lift of the user's d-th next item is replay_strength * decay^(d - 1).",
        },
    )
    replay_strength: float = field(
        default=5.0,
        metadata={
            "min": 0,
            "help": "replay oracle: z of the user's very next item, in the standard deviations a model "
            "oracle's z is measured in (P_pref = sigmoid(b0 + preference_slope * z)).",
        },
    )
    replay_popularity_exponent: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "max": 4,  # (n_med / n_a)^4 already discounts an item 10 times the median by 10,000
            "help": "replay oracle: gamma of the popularity discount of a future item's lift, "
            "min(1, (n_med / n_a)^gamma), n_a the item's interactions (0: no discount; docs/simulator.md).",
        },
    )
    click_next: float = field(
        default=0.5,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Boost when the exposed item is the user's true next item: P = 1 - (1 - P_pref)(1 - boost).",
        },
    )
    click_soon: float = field(
        default=0.25,
        metadata={
            "min": 0,
            "max": 1,
            "help": "Boost when the exposed item is among the user's next soon_horizon items after the next "
            "one (taken a little later: still of interest).",
        },
    )
    soon_horizon: int = field(
        default=3, metadata={"min": 0, "help": "How many items after the true next one count as soon."}
    )
