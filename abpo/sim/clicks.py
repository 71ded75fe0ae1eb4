"""The click model of the simulated users (every parameter in config section `sim`; docs/loop.md "Simulator").

For a request at position t of user u's real sequence x (history x_{1:t}), the exposed item a is clicked with

    P(click | a) = 1 - (1 - P_pref(u, a)) * (1 - boost(a))

    P_pref(u, a) = sigmoid(b0 + preference_slope * z(u, a))      the ground truth (abpo.sim.preference)
    boost(a)     = click_next   if a = x_{t+1}                    the user's true next item
                 = click_soon   if a in x_{t+2 .. t+1+soon_horizon}
                 = 0            otherwise

So any item the user would like can be clicked, the true next items most likely; a positive is likely but not
certain, and a no-response is ambiguous (the stratification docs/ABPO_SPEC.md assumes). The "soon" items never reach
the held-out evaluation target x_{T+N}: the simulator passes only update-segment items."""

from __future__ import annotations

from collections.abc import Sequence


def boost(exposed: int, next_item: int, soon: Sequence[int], sim_cfg) -> float:
    """boost(a) of the module docstring."""
    if int(exposed) == int(next_item):
        return float(sim_cfg.click_next)
    if int(exposed) in {int(i) for i in soon}:
        return float(sim_cfg.click_soon)
    return 0.0


def click_probability(p_pref: float, exposed: int, next_item: int, soon: Sequence[int], sim_cfg) -> float:
    """P(click | exposed item) of the module docstring, from the item's preference probability."""
    b = boost(exposed, next_item, soon, sim_cfg)
    return float(1.0 - (1.0 - float(p_pref)) * (1.0 - b))


def check_click_config(sim_cfg) -> None:
    for key in ("click_next", "click_soon"):
        v = getattr(sim_cfg, key)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"config sim.{key} = {v}: rule: a probability in [0, 1]")
    if not 0.0 <= sim_cfg.base_ctr < 1.0:
        raise ValueError(f"config sim.base_ctr = {sim_cfg.base_ctr}: rule: in [0, 1) (0: only the boosts click)")
    if sim_cfg.preference_slope < 0:
        raise ValueError(f"config sim.preference_slope = {sim_cfg.preference_slope}: rule: >= 0")
    if sim_cfg.soon_horizon < 0:
        raise ValueError(f"config sim.soon_horizon = {sim_cfg.soon_horizon}: rule: >= 0")
