"""The click model of the simulated users (every parameter in config section `sim`; README "Simulator").

For a request at position t of a user's real sequence x (history x_{1:t}), the exposed item a is clicked with

    P(click | a) = click_next                                    if a = x_{t+1}   (the user's true next item)
                 = click_soon                                    if a in x_{t+2 .. t+1+soon_horizon}
                 = click_base + click_taste * overlap(a, x)      otherwise

with overlap(a, x) = |genres(a) & genres(x_{t-taste_window+1..t})| / |genres(a)| in [0, 1] (0 for an item without
genres). So a positive is likely but not certain, and a no-response is ambiguous: the exposed item may still have
been of interest (the positive stratum is imperfect, the no-response stratum is not a negative label, as
docs/ABPO_SPEC.md assumes). The "soon" items never reach the held-out evaluation target x_{T+N}: the simulator passes
only update-segment items."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def genre_overlap(item: int, recent: Sequence[int], genres: Mapping[int, Sequence[str]]) -> float:
    g = set(genres.get(int(item), ()))
    if not g:
        return 0.0
    seen: set[str] = set()
    for i in recent:
        seen.update(genres.get(int(i), ()))
    return len(g & seen) / len(g)


def click_probability(exposed: int, next_item: int, soon: Sequence[int], history: Sequence[int],
                      genres: Mapping[int, Sequence[str]], sim_cfg) -> float:
    """P(click | exposed item) of the module docstring."""
    if int(exposed) == int(next_item):
        return float(sim_cfg.click_next)
    if int(exposed) in {int(i) for i in soon}:
        return float(sim_cfg.click_soon)
    recent = list(history)[-sim_cfg.taste_window:] if sim_cfg.taste_window > 0 else []
    p = sim_cfg.click_base + sim_cfg.click_taste * genre_overlap(exposed, recent, genres)
    return float(min(max(p, 0.0), 1.0))


def check_click_config(sim_cfg) -> None:
    for key in ("click_next", "click_soon", "click_base", "click_taste"):
        v = getattr(sim_cfg, key)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"config sim.{key} = {v}: rule: a probability in [0, 1]")
    if sim_cfg.click_base + sim_cfg.click_taste > 1.0:
        raise ValueError("config sim.click_base + sim.click_taste > 1: rule: P(click) of an other item stays <= 1")
    if sim_cfg.soon_horizon < 0 or sim_cfg.taste_window < 0:
        raise ValueError("config sim.soon_horizon and sim.taste_window: rule: >= 0")
