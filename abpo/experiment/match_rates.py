"""What a cell measures besides the table's metrics: the round policy's match rates on the round's logged
exposures by stratum (the paper's Fig. 1-2), its off-policy value on that log (Eq. SNIPS-V), and the update's
per-step training diagnostics averaged over the cell."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from abpo.data.candidates import Example
from abpo.experiment.seeds import SeedContext


def policy_scores(model, tok, ctx: SeedContext, examples) -> list:
    from abpo.policy.scoring import score_examples

    return score_examples(model, tok, examples, ctx.dataset.titles(), ctx.cfg.policy)


def match_rates(model, tok, ctx: SeedContext, bandit_log) -> dict[str, float]:
    """The policy's match rates on ``bandit_log``'s exposures, by stratum: the mean e(a_log|q) (Eq. e_p at
    policy.tau) over the clicked rows and over the no-response rows, i.e. the probability that a constrained rollout
    names the exposed item (the quantity the update's rollout match rates estimate)."""
    from abpo.policy.scoring import candidate_propensities

    cols = {k: bandit_log.column(k).to_pylist() for k in ("request_id", "user_id", "history", "candidates", "item_id")}
    exs = [
        Example(rid, int(u), list(h), list(c), int(a))
        for rid, u, h, c, a in zip(
            cols["request_id"], cols["user_id"], cols["history"], cols["candidates"], cols["item_id"]
        )
    ]
    probs = []
    for s in policy_scores(model, tok, ctx, exs):
        e = candidate_propensities(s.scores, ctx.cfg.policy.tau)
        probs.append(float(e[list(s.example.candidates).index(s.example.positive)]))
    clicked = bandit_log.column("clicked").to_pylist()
    return {
        **_rates_by_stratum(probs, clicked),
        **off_policy_value(probs, bandit_log.column("propensity").to_pylist(), clicked),
    }


def logged_match_rates(bandit_log) -> dict[str, float]:
    """``match_rates`` of the policy that logged ``bandit_log``, without scoring again: its e(a_log|q) is the
    stored propensity (abpo.policy.bandit), so its off-policy value is the log's click rate (every weight 1)."""
    e0, clicked = bandit_log.column("propensity").to_pylist(), bandit_log.column("clicked").to_pylist()
    return {**_rates_by_stratum(e0, clicked), **off_policy_value(e0, e0, clicked)}


def _rates_by_stratum(probs: Sequence[float], clicked: Sequence[int]) -> dict[str, float]:
    """Mean e(a_log|q) over the clicked and over the no-response rows, and the row counts."""
    sums, counts = {1: 0.0, 0: 0.0}, {1: 0, 0: 0}
    for p, y in zip(probs, clicked, strict=True):
        sums[int(y)] += float(p)
        counts[int(y)] += 1
    return {
        "match_positive": sums[1] / counts[1] if counts[1] else float("nan"),
        "match_no_response": sums[0] / counts[0] if counts[0] else float("nan"),
        "log_rows": len(probs),
        "log_clicks": counts[1],
    }


def off_policy_value(probs: Sequence[float], e0: Sequence[float], clicked: Sequence[int]) -> dict[str, float]:
    """The round policy's off-policy click rate on the round's log (Eq. SNIPS-V of docs/regimes.md, the
    self-normalised estimator): V = sum_i w_i y_i / sum_i w_i with w_i = e(a_log,i | q_i) / e0_i, the policy's
    propensity of the logged item over the logger's; and the weights' effective sample size share
    (sum w)^2 / (n sum w^2). The log is the one the round trained on, so for an updated row this is an in-sample
    value (it says what the policy would collect on the requests it learned from, not on new ones)."""
    w = np.asarray(probs, dtype=np.float64) / np.asarray(e0, dtype=np.float64)
    y = np.asarray(clicked, dtype=np.float64)
    if w.size == 0 or not np.isfinite(w).all() or w.sum() <= 0:
        return {"ope_snips": float("nan"), "ope_ess_share": float("nan")}
    return {"ope_snips": float((w * y).sum() / w.sum()), "ope_ess_share": float(w.sum() ** 2 / (w.size * (w**2).sum()))}


TRAINING_DIAGNOSTICS = {  # per-step update metrics (docs/diagnostics.md) averaged over a cell's steps
    "train_match_positive": "abpo/match_rate/positive",
    "train_match_no_response": "abpo/match_rate/no_response",
    "train_w_p99": "abpo/w_p99",
    "train_w_max": "abpo/w_max",
    "train_w_ess_share": "abpo/w_ess_share",
    "train_gamma_ratio": "abpo/gamma_ratio",
    "train_grad_cosine": "abpo/grad_cosine_vs_grpo",
    # the share of the step's summed |advantage| the no-response rows carry
    "train_no_response_abs_share": "abpo/advantages/no_response_abs_share",
}


def training_diagnostics(cell: Mapping) -> dict[str, float]:
    """A cell's TRAINING_DIAGNOSTICS: the mean over its update's logged steps of each per-step metric (NaN where the
    cell trained nothing or the metric was not logged); ``train_w_max`` is the maximum, not the mean."""
    hist = [h for h in (cell.get("update") or {}).get("history", []) if isinstance(h, Mapping)]
    out = {}
    for name, key in TRAINING_DIAGNOSTICS.items():
        v = [float(h[key]) for h in hist if key in h and h[key] is not None and math.isfinite(float(h[key]))]
        out[name] = (max(v) if name == "train_w_max" else float(np.mean(v))) if v else float("nan")
    return out
