"""Step ``gate`` (Airflow task ``<arm>.gate``): the challenger against the arm's champion.

    offline      HR@5 (``arms.gate_metric``) user by user on the same held-out users: a paired non-inferiority
                 test (abpo.evaluation.paired: Tango's score test for 0/1 hits, docs/gate.md) passes when its
                 p-value for "challenger - champion <= -``arms.gate_margin``" (absolute) is below
                 ``arms.gate_alpha`` (equivalently, the score interval's one-sided lower bound is > -margin), its MDE
                 at ``arms.gate_power`` reported beside it; the users are the configured dataset's
                 (``arms.gate_users = dataset``) or the deployment's own: a seeded hash slice of the warehouse's
                 users, each one's last interaction through the month as target, whose impressions no update trains
                 on (``warehouse``)
    off-policy   the CTR difference challenger - champion on the month's logs under ``arms.gate_ope_estimator``
                 (:func:`ope_estimates_on_rows`: SNIPS on the arm's own rows, or DM / IPS / SNIPS / DR / SNDR /
                 Switch-DR on every arm's rows with a cross-fitted reward model; SNDR by default): its bootstrap
                 lower bound at least -``arms.gate_ope_margin``, the estimate finite and in [0, 1], both versions'
                 weights' effective sample size at least ``arms.gate_min_ess`` (and 2), and the share of the total
                 weight carried by the challenger's largest weights (the top ``arms.gate_top_weight_fraction`` of
                 the rows) at most ``arms.gate_max_top_weight_share`` (fails closed); a month without clicks decided
                 on the champion's zero-click bound, one with every row clicked on IPS too
                 (abpo.monthly.gate_verdict.ope_verdict); every estimator's numbers are recorded

The decision is :func:`gate_verdict`, a pure function of those numbers; :func:`gate` computes them (scoring,
the warehouse's logs), applies it, and records every number in MLflow: metrics of the versions' LoggedModels (the
offline metrics on both, with their per-user ranks as an artifact of the run that logged each version; the gate's
numbers on the challenger) and of the gate's run; the verdict, its reason, the paired test's numbers
(``gate.offline.*``) and the off-policy half's (``gate.ope.*``) are version tags."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import versions as arm_versions
from abpo.data.holdout import check_gate_ope_rows, holdout_slice
from abpo.evaluation.off_policy import compare_snips, top_weight_share
from abpo.monthly.common import CHAMPION, StepResult, completed_step, dataset_and_splits, start_run
from abpo.monthly.gate_users import (
    GateSet,
    gate_examples,
)
from abpo.monthly.gate_verdict import (
    GateVerdict,
    gate_verdict,
)
from abpo.policy.model import load_policy

if TYPE_CHECKING:
    import numpy as np

    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GateResult(StepResult):
    arm: str
    version: str  # the challenger
    champion_version: str
    passed: bool
    reason: str
    metric: str
    challenger: dict[str, float]  # offline metrics on the gate's users
    champion: dict[str, float]
    off_policy: dict[str, Any] | None  # ope_numbers: the deciding estimator's and every one's, None when not run
    offline: dict[str, Any] | None = None  # the paired test's numbers (abpo.evaluation.paired.PairedTest)
    # each half's own verdict (abpo.monthly.gate_verdict.GateVerdict): which half refused a challenger, read by
    # benchmarks/gate_refusals.py; ope_passed is True when the off-policy half did not run, None
    # in a record written before these fields
    offline_passed: bool | None = None
    ope_passed: bool | None = None
    # which evidence decided (decided_by): off-policy, offline or both; None in a record written before the field
    decided_by: str | None = None


# The dataset name of the offline metrics on the version's LoggedModel, and the folder of their per-user ranks in the
# artifacts of the run that logged the version (<GATE_DATASET>/<user set key>.json). Versioned: "gate-users" (v1)
# kept the metrics alone; a v1 cache is never read, so a version scored before is scored again, with its ranks.
GATE_DATASET = "gate-users-v2"


def _ranks_artifact(key: str) -> str:
    return f"{GATE_DATASET}/{key}.json"


def kept_ranks(mv, key: str, examples) -> list[int] | None:
    """The per-user target ranks kept for version ``mv`` on user set ``key`` (:func:`record_offline_metrics`), in
    the order of ``examples``; None when none are kept or they are of other users (then the version is scored
    again, never misread)."""
    kept = registry.version_dict(mv, _ranks_artifact(key))
    if kept is None:
        return None
    if kept.get("request_ids") != [e.request_id for e in examples] or len(kept.get("ranks", ())) != len(examples):
        log.warning(f"  {_ranks_artifact(key)} of {mv.name} v{mv.version} holds the ranks of other users: scored again")
        return None
    return [int(r) for r in kept["ranks"]]


def offline_scores(
    cfg: Config, arm: str, version: str, month: str | None = None, *, gate_set: GateSet | None = None
) -> tuple[dict[str, float], list[int]]:
    """The version's offline metrics on the gate's users (:func:`gate_examples` of ``month``, or ``gate_set`` when
    the caller built it) and each user's 1-based target rank (in the order of the examples), computed once per
    (version, user set) and kept: the metrics on the version's MLflow LoggedModel, measured on dataset
    ``GATE_DATASET`` whose digest is the user set's key, the ranks as artifact <GATE_DATASET>/<key>.json of the run
    that logged the version (versions are immutable, so a champion is never scored twice on one user set)."""
    from abpo.policy.evaluate import evaluate_policy

    gate_set = gate_set if gate_set is not None else gate_examples(cfg, month)
    examples, popularity, key = gate_set
    mv = arm_versions.get_version(cfg, arm, version)
    kept = registry.model_metrics(mv, dataset_name=GATE_DATASET, dataset_digest=key)
    ranks = kept_ranks(mv, key, examples) if kept else None
    if kept and ranks is not None:
        return kept, ranks
    ds, _ = dataset_and_splits(cfg)
    t = time.time()
    path = arm_versions.local_dir(cfg, arm, version)
    model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(path)), cfg.paths, dataset=ds)
    res = evaluate_policy(model, tok, examples, ds.titles(), cfg.policy, popularity=popularity, progress=False)
    metrics = record_offline_metrics(cfg, arm, version, res.metrics, ranks=res.ranks, gate_set=gate_set)
    log.info(
        f"  scored {arm} v{version} on {len(examples)} held-out users ({cfg.arms.gate_users}'s, user set {key}) "
        f"in {time.time() - t:.1f}s"
    )
    return metrics, [int(r) for r in res.ranks]


def offline_metrics(
    cfg: Config, arm: str, version: str, month: str | None = None, *, gate_set: GateSet | None = None
) -> dict[str, float]:
    """The metrics of :func:`offline_scores`."""
    return offline_scores(cfg, arm, version, month, gate_set=gate_set)[0]


def record_offline_metrics(
    cfg: Config,
    arm: str,
    version: str,
    metrics: dict[str, float],
    month: str | None = None,
    *,
    ranks: Sequence[int],
    gate_set: GateSet | None = None,
) -> dict[str, float]:
    """Keep ``metrics`` and the per-user target ``ranks`` (on the gate's users, in the order of its examples) for the
    version: the metrics on its LoggedModel (through the run that logged it; dataset ``GATE_DATASET``, digest the
    user set's key, also the version's tag ``gate.eval_key``), the ranks as that run's artifact
    <GATE_DATASET>/<key>.json with the users' request ids; returns the metrics without random_*. ``gate_set``: the
    gate's users when the caller has them, else those of :func:`gate_examples` of ``month``."""
    examples, _, key = gate_set if gate_set is not None else gate_examples(cfg, month)
    if len(ranks) != len(examples):
        raise ValueError(
            f"gate: {len(ranks)} per-user ranks for {arm} v{version} on user set {key} of "
            f"{len(examples)} users; rule: one rank per gate user, in the order of its examples"
        )
    kept = {k: float(v) for k, v in metrics.items() if not k.startswith("random_")}
    mv = arm_versions.get_version(cfg, arm, version)
    registry.log_version_dict(
        mv,
        {"key": key, "request_ids": [e.request_id for e in examples], "ranks": [int(r) for r in ranks]},
        _ranks_artifact(key),
    )
    registry.log_model_metrics(mv, kept, dataset_name=GATE_DATASET, dataset_digest=key)
    arm_versions.set_tags(cfg, arm, version, {"gate.eval_key": key})
    return kept


def off_policy_gate(cfg: Config, arm: str, version: str, month: str, *, champion: str | None = None) -> dict[str, Any]:
    """The off-policy half's numbers (:func:`ope_numbers`) on the month-``month`` logs of every arm: the challenger's
    and the champion's propensity vectors over each row's candidates (both versions score every row), each row's
    logged propensity as e0, and every estimator of :func:`ope_estimates_on_rows` (SNIPS on the arm's own rows,
    the doubly robust family on every arm's); ``arms.gate_ope_estimator`` names the one that decides. On the arm's
    own rows logged by the champion itself, the champion's SNIPS weight is e0 / e0 = 1.

    An arm that served none of the month's rows (its challenger trained on the other arms' rows,
    ``arms.update_logs = all``) is gated on every arm's rows like any other: SNIPS on its own rows is recorded as
    not computed (n 0, NaN), and the ``snips`` choice fails closed saying so."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from abpo.warehouse import open_warehouse

    ds, _ = dataset_and_splits(cfg)
    champ = arm_versions.get_version(cfg, arm, champion or CHAMPION)
    with open_warehouse(cfg, read_only=True) as wh:
        pos, neg = wh.strata([month])
    rows = pa.concat_tables([pos, neg])
    if check_gate_ope_rows(cfg.arms.gate_ope_rows) == "heldout":
        rows, month_rows = gate_rows(rows, cfg.seed, cfg.arms.gate_holdout_fraction), rows.num_rows
        log.info(
            f"  off-policy gate {arm} v{version}: {rows.num_rows} of the {month_rows} rows of {month} are the held-out "
            f"users' (arms.gate_holdout_fraction={cfg.arms.gate_holdout_fraction:g}), which no update trained on"
        )
    own = np.asarray(pc.equal(rows.column("arm"), arm).to_numpy(zero_copy_only=False), dtype=bool)
    if not own.any():
        log.warning(
            f"  off-policy gate {arm} v{version}: none of the {rows.num_rows} logged rows of {month} is arm {arm}'s "
            "own (it served nothing): gated on every arm's rows, SNIPS on its own rows not computed"
        )
    reqs = list(
        zip(
            rows.column("user_id").to_pylist(),
            rows.column("history").to_pylist(),
            rows.column("candidates").to_pylist(),
        )
    )
    items = rows.column("item_id").to_pylist()

    def target(ref: str) -> list[np.ndarray]:
        arm_obj = arm_versions.load_arm(cfg, arm, ds, ref)
        return [np.asarray(p, dtype=np.float64) for p in arm_obj.propensities(reqs)]

    e0 = np.asarray(rows.column("propensity").to_pylist(), dtype=np.float64)
    versions = rows.column("model_version").to_pylist()
    champ_logged_own = {v for v, o in zip(versions, own, strict=True) if o} == {str(champ.version)}
    pi_champ = target(str(champ.version))
    pi_new = target(str(version))
    bad = sum(int((~np.isfinite(p)).sum()) for p in (*pi_new, *pi_champ))
    if bad:  # NaN weights: no estimate at all; every number NaN, so ope_verdict fails the gate closed
        nan = float("nan")
        log.warning(
            f"  off-policy gate {arm} v{version}: {bad} target propensities not finite on {rows.num_rows} "
            "rows: fails closed"
        )
        return {
            "estimator": cfg.arms.gate_ope_estimator,
            "n": rows.num_rows,
            "challenger_estimate": nan,
            "champion_estimate": nan,
            "diff": nan,
            "ci_low": nan,
            "ci_high": nan,
            "confidence": nan,
            "challenger_ess": nan,
            "champion_ess": nan,
            "challenger_max_weight": nan,
            "non_finite_propensities": bad,
            "estimates": {},
        }
    estimates = ope_estimates_on_rows(
        candidates=rows.column("candidates").to_pylist(),
        logged_items=items,
        history_lengths=[len(h or ()) for h in rows.column("history").to_pylist()],
        clicked=rows.column("clicked").to_pylist(),
        e0=e0,
        challenger=pi_new,
        champion=pi_champ,
        users=rows.column("user_id").to_pylist(),
        own=own,
        champion_logged_own=champ_logged_own,
        n_boot=cfg.arms.gate_ope_bootstrap,
        seed=cfg.seed,
        switch_lambda=cfg.arms.gate_ope_switch_lambda,
        top_fraction=cfg.arms.gate_top_weight_fraction,
    )
    return ope_numbers(estimates, cfg.arms.gate_ope_estimator)


def gate_rows(rows, seed: int, fraction: float):
    """The rows of ``rows`` (a month's logged impressions, column user_id) whose user is in the held-out slice
    (abpo.data.holdout: seed ``seed``, share ``fraction``): the rows the off-policy half reads with
    ``arms.gate_ope_rows = heldout``, every arm's, none of which an LLM update trained on
    (abpo.train.strata.read_update_strata leaves the same users out)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    users = np.unique(rows.column("user_id").to_numpy(zero_copy_only=False))
    held = holdout_slice(users.tolist(), seed, fraction)
    return rows.filter(pc.is_in(rows.column("user_id"), value_set=pa.array(held, pa.int64())))


# the reward model's folds (abpo.evaluation.reward_model.cross_fitted_rewards), over users
OPE_FOLDS = 5


def _weights_summary(w: np.ndarray, top_fraction: float) -> dict[str, Any]:
    """ESS (Kish), the largest weight, the share of the total its top ``top_fraction`` of rows carry, and the weights'
    mean with its standard error (sd / sqrt(n)): with the loggers' own propensities as e0, E[pi/e0] = sum_a pi(a) = 1
    on every row (each logger puts mass on every candidate), so a mean far above 1 says the logged propensities are
    smaller than the loggers' (abpo.monthly.gate_verdict.ope_verdict, case 3)."""
    import numpy as np

    nan = float("nan")
    if w.size == 0:  # no row: no weight, nothing to summarise (the verdict fails closed on n 0)
        return {
            "ess": 0.0,
            "max_weight": nan,
            "top_weight_share": nan,
            "top_weight_rows": 0,
            "mean_weight": nan,
            "mean_weight_se": nan,
        }
    total = float(w.sum())
    ess = total**2 / float((w * w).sum()) if total > 0 else 0.0
    share, k = top_weight_share(w, top_fraction)
    se = float(np.std(w, ddof=1)) / math.sqrt(w.size) if w.size > 1 else nan
    return {
        "ess": ess,
        "max_weight": float(np.max(w)),
        "top_weight_share": share,
        "top_weight_rows": k,
        "mean_weight": total / w.size,
        "mean_weight_se": se,
    }


def _champion_weights(w: np.ndarray) -> dict[str, Any]:
    """The champion's entries of an estimate: its weights' ESS, mean and the mean's standard error."""
    s = _weights_summary(w, 0.01)
    return {
        "champion_ess": s["ess"],
        "champion_mean_weight": s["mean_weight"],
        "champion_mean_weight_se": s["mean_weight_se"],
    }


def _snips_on_own_rows(
    y: np.ndarray,
    e0: np.ndarray,
    p_new: np.ndarray,
    p_old: np.ndarray,
    *,
    n_boot: int,
    confidence: float,
    seed: int,
    top_fraction: float,
) -> dict[str, Any]:
    """The ``snips`` entry of :func:`ope_estimates_on_rows`: compare_snips on the arm's own rows (their clicks ``y``,
    logged ``e0``, the challenger's ``p_new`` and the champion's ``p_old`` of the logged item), with IPS's difference
    and interval on the same resamples; no row (the arm served nothing): n 0 and every number NaN."""
    nan = float("nan")
    if y.size == 0:
        return {
            "rows": "own",
            "n": 0,
            "clicks": 0,
            **dict.fromkeys(("challenger", "champion", "diff", "ci_low", "ci_high"), nan),
            **dict.fromkeys(("ips_diff", "ips_ci_low", "ips_ci_high"), nan),
            "confidence": confidence,
            **_champion_weights(p_old),
            **{f"challenger_{k}": v for k, v in _weights_summary(p_new, top_fraction).items()},
        }
    cmp = compare_snips(y, e0, p_new, p_old, n_boot=n_boot, confidence=confidence, seed=seed)
    return {
        "rows": "own",
        "n": cmp.n,
        "clicks": int(y.sum()),
        "challenger": cmp.challenger.snips,
        "champion": cmp.champion.snips,
        "diff": cmp.diff,
        "ci_low": cmp.ci_low,
        "ci_high": cmp.ci_high,
        "confidence": confidence,
        **_champion_weights(p_old / e0),
        "champion_ess": cmp.champion.ess,
        "ips_diff": cmp.ips_diff,
        "ips_ci_low": cmp.ips_ci_low,
        "ips_ci_high": cmp.ips_ci_high,
        **{f"challenger_{k}": v for k, v in _weights_summary(p_new / e0, top_fraction).items()},
    }


def ope_estimates_on_rows(
    *,
    candidates: Sequence[Sequence[int]],
    logged_items: Sequence[int],
    history_lengths: Sequence[int],
    clicked: Any,  # (n,) 0/1, a sequence or an array
    e0: Any,  # (n,)
    challenger: Sequence[Any],  # per row, a probability vector over its candidates
    champion: Sequence[Any],
    users: Sequence[int],
    own: Any,  # (n,) bool
    champion_logged_own: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
    switch_lambda: float = 10.0,
    top_fraction: float = 0.01,
    confidence: float = 0.95,
) -> dict[str, dict[str, Any]]:
    """Every estimator of the off-policy half on one month's logged rows (the gate's, and
    benchmarks/ope_coverage.py's): per name of arms.gate_ope_estimator's choices, the challenger's and the
    champion's CTR estimate, their difference ``diff`` with its percentile bootstrap interval (``ci_low``,
    ``ci_high``, ``boot_se``), the rows it read (``rows``: ``own`` or ``all``, ``n``) and the challenger's weights'
    ESS, largest weight and top share on those rows.

    ``clicks``: the clicked rows among those it read (0 or ``n``: the verdict's degenerate cases).

    ``snips``: abpo.evaluation.off_policy.compare_snips on the ``own`` rows (the arm's), each row's logged e0, the
    champion's weight 1 where ``champion_logged_own`` (it logged them), interval over rows, with IPS's difference
    and interval on the same rows and resamples (``ips_diff``, ``ips_ci_low``, ``ips_ci_high``); no own row (the arm
    served nothing): n 0 and every number NaN, the other estimators unchanged. The others:
    compare_ope_on_logs on every row (dm, ips, snips_all = SNIPS, dr, sndr, switch_dr at ``switch_lambda``), the
    reward model cross-fitted over OPE_FOLDS folds of ``users`` (a user's rows in one fold, so no row is scored by a
    model fitted on it), the bootstrap over users. ``challenger`` / ``champion``: each row's probability vector
    over its candidates; row i's logged item is ``logged_items[i]`` of ``candidates[i]``."""
    import numpy as np

    from abpo.evaluation.off_policy import compare_ope_on_logs

    n = len(candidates)
    y = np.asarray(clicked, dtype=np.float64).reshape(n)
    logged_e0 = np.asarray(e0, dtype=np.float64).reshape(n)
    own_mask = np.asarray(own, dtype=bool).reshape(n)
    idx = np.array([list(c).index(a) for c, a in zip(candidates, logged_items, strict=True)], dtype=np.int64)
    p_new = np.array([float(p[i]) for p, i in zip(challenger, idx, strict=True)], dtype=np.float64)
    p_old = np.array([float(p[i]) for p, i in zip(champion, idx, strict=True)], dtype=np.float64)
    nan = float("nan")
    out: dict[str, dict[str, Any]] = {
        "snips": _snips_on_own_rows(
            y[own_mask],
            logged_e0[own_mask],
            p_new[own_mask],
            logged_e0[own_mask] if champion_logged_own else p_old[own_mask],
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
            top_fraction=top_fraction,
        )
    }
    family = ("dm", "ips", "snips_all", "dr", "sndr", "switch_dr")
    n_users = len(set(users))
    weights_all = {f"challenger_{k}": v for k, v in _weights_summary(p_new / logged_e0, top_fraction).items()}
    champion_all = _champion_weights(p_old / logged_e0)
    if n_users >= 2:
        cmps = compare_ope_on_logs(
            candidates,
            logged_items,
            history_lengths,
            clicked,
            logged_e0.tolist(),
            challenger,
            champion,
            groups=users,
            n_folds=min(OPE_FOLDS, n_users),
            switch_lambda=switch_lambda,
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
        )
        for name, c in cmps.items():
            out["snips_all" if name == "snips" else name] = {
                "rows": "all",
                "n": n,
                "clicks": int(y.sum()),
                "challenger": c.challenger.value,
                "champion": c.champion.value,
                "diff": c.diff,
                "ci_low": c.ci_low,
                "ci_high": c.ci_high,
                "boot_se": c.boot_se,
                "confidence": confidence,
                **champion_all,
                **weights_all,
            }
    else:  # one user (or none): no other fold to fit the reward model on, no resample: every number NaN (fails closed)
        for name in family:
            out[name] = {
                "rows": "all",
                "n": n,
                "clicks": int(y.sum()),
                "diff": nan,
                "ci_low": nan,
                "ci_high": nan,
                "challenger": nan,
                "champion": nan,
                "confidence": confidence,
                **champion_all,
                **weights_all,
            }
    if "snips" in out:  # compare_snips' interval has no SE of its own: the bootstrap's, for a like-for-like table
        out["snips"]["boot_se"] = nan
    return out


def ope_numbers(estimates: dict[str, dict[str, Any]], estimator: str) -> dict[str, Any]:
    """The off-policy half's numbers, as gate_verdict reads them: the deciding ``estimator``'s (its estimates of the
    challenger's and the champion's CTR, their difference and its interval, both versions' weights' ESS, the
    challenger's top share, the clicked rows among the rows it read), IPS's difference and interval on the same rows
    (``ips``: what the verdict reads when every row is clicked), the arm's own rows (``own_rows``), with
    ``estimates``, every estimator's numbers (:func:`ope_estimates_on_rows`)."""
    if estimator not in estimates:
        raise ValueError(
            f"off-policy gate: arms.gate_ope_estimator {estimator!r} has no estimate on these rows (have "
            f"{sorted(estimates)}); rule: one of abpo.config.arms.GATE_OPE_ESTIMATORS"
        )
    d = estimates[estimator]
    nan = float("nan")
    if d["rows"] == "own":
        ips = {k: d.get(f"ips_{k}", nan) for k in ("diff", "ci_low", "ci_high")}
    else:
        ips = {k: estimates.get("ips", {}).get(k, nan) for k in ("diff", "ci_low", "ci_high")}
    return {
        "estimator": estimator,
        "rows": d["rows"],
        "n": d["n"],
        "challenger_estimate": d["challenger"],
        "champion_estimate": d["champion"],
        "diff": d["diff"],
        "ci_low": d["ci_low"],
        "ci_high": d["ci_high"],
        "confidence": d["confidence"],
        "challenger_ess": d["challenger_ess"],
        "champion_ess": d["champion_ess"],
        "challenger_max_weight": d["challenger_max_weight"],
        "challenger_mean_weight": d.get("challenger_mean_weight", float("nan")),
        "challenger_mean_weight_se": d.get("challenger_mean_weight_se", float("nan")),
        "champion_mean_weight": d.get("champion_mean_weight", float("nan")),
        "champion_mean_weight_se": d.get("champion_mean_weight_se", float("nan")),
        "challenger_top_weight_share": d["challenger_top_weight_share"],
        "top_weight_rows": d["challenger_top_weight_rows"],
        "clicks": d["clicks"],
        "own_rows": estimates["snips"]["n"] if "snips" in estimates else None,
        "ips": ips,
        "estimates": estimates,
    }


PAIRED_NUMBERS = (
    "n",
    "challenger",
    "champion",
    "diff",
    "se",
    "lower",
    "margin",
    "alpha",
    "p_value",
    "statistic",
    "power",
    "mde",
    "wins",
    "losses",
    "ties",
)


def offline_tags(metric: str, offline: dict[str, Any]) -> dict[str, str]:
    """The paired test's numbers as the challenger's version tags ``gate.offline.<name>`` (docs/gate.md)."""
    if not offline:
        return {}
    tags = {
        f"gate.offline.{k}": (f"{offline[k]:.6g}" if isinstance(offline[k], float) else str(offline[k]))
        for k in PAIRED_NUMBERS
    }
    tags.update(
        {
            "gate.offline.metric": metric,
            "gate.offline.users": str(offline["n"]),
            "gate.offline.passed": str(bool(offline["passed"])).lower(),
            "gate.offline.method": offline["method"],
        }
    )
    del tags["gate.offline.n"]
    if "upper" in offline:  # the guardrail's bound (arms.gate_primary = ope)
        tags["gate.offline.upper"] = f"{offline['upper']:.6g}"
    return tags


OPE_TAGGED = (
    "rows",
    "n",
    "diff",
    "ci_low",
    "ci_high",
    "confidence",
    "challenger_estimate",
    "champion_estimate",
    "challenger_ess",
)


def ope_tags(ope: dict[str, Any] | None, margin: float) -> dict[str, str]:
    """The off-policy half's numbers as the challenger's version tags (docs/gate.md): ``gate.ope.estimator`` (the
    one that decided), ``gate.ope.<name>`` its numbers, ``gate.ope.margin``, and ``gate.ope.estimates``, every
    estimator's difference and interval on one line (``dr +0.0187 [+0.0135, +0.0240] all; snips ... own``)."""
    if not ope:
        return {}
    tags = {"gate.ope.estimator": str(ope.get("estimator", "snips")), "gate.ope.margin": f"{margin:.6g}"}
    for k in OPE_TAGGED:
        if k in ope:
            v = ope[k]
            tags[f"gate.ope.{k}"] = f"{v:.6g}" if isinstance(v, float) else str(v)
    tags["gate.ope.estimates"] = "; ".join(
        f"{name} {d['diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] {d['rows']}"
        for name, d in (ope.get("estimates") or {}).items()
    )
    return tags


def ope_metrics(ope: dict[str, Any] | None) -> dict[str, float]:
    """The off-policy half's numbers as MLflow metrics: ``ope.<name>`` for the deciding estimator's, and
    ``ope.<estimator>.<name>`` (diff, ci_low, ci_high, challenger, champion) for every estimator's."""
    out: dict[str, float] = {}
    for k, v in (ope or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"ope.{k}"] = float(v)
    for name, d in ((ope or {}).get("estimates") or {}).items():
        for k in ("diff", "ci_low", "ci_high", "challenger", "champion"):
            out[f"ope.{name}.{k}"] = float(d[k])
    return out


def finite_or_none(d: Any) -> Any:
    """``d`` with every non-finite float (a NaN interval of an estimator that could not run, Tango's statistic at a
    margin outside (-1, 1)) as None, recursively: the gate's result travels as JSON (the task's XCom refuses NaN);
    the verdict is decided before, on the numbers themselves."""
    if isinstance(d, dict):
        return {k: finite_or_none(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [finite_or_none(v) for v in d]
    if isinstance(d, float) and not math.isfinite(d):
        return None
    return d


def decided_by(primary: str, ope: dict[str, Any] | None) -> str:
    """Which evidence decided a gate (the version tag ``gate.decided_by``, read by the report, the UI and ``abpo arms
    history``): ``off-policy`` (arms.gate_primary = ope with the month's off-policy numbers: the offline half a
    guardrail), ``offline`` (no off-policy numbers: no month's logs read, or the check disabled), ``both``
    (arms.gate_primary = offline with the off-policy half beside it)."""
    if ope is None:
        return "offline"
    return "off-policy" if primary == "ope" else "both"


def month_start_champion(cfg: Config, arm: str, version: str):
    """The champion the gate compares challenger ``version`` against: the one the month's update read once at its
    start and trained from (the challenger's lineage tag ``parent_version``), not whatever the alias points to now,
    so a rollback or hand move during the month cannot have the challenger gated against a champion it was not
    trained from (its promote then refuses: abpo.arms.promotion_lock.ChampionMoved). A challenger without a parent (none
    of the update's) is gated against the current champion."""
    mv = arm_versions.get_version(cfg, arm, str(version))
    parent = ((mv.tags or {}).get("parent_version", "") if mv is not None else "") or ""
    champ = arm_versions.get_version(cfg, arm, parent) if parent else None
    if champ is None:
        champ = arm_versions.get_version(cfg, arm, CHAMPION)
    if champ is None:
        raise arm_versions.NotInRegistry(f"{arm_versions.model_name(arm, cfg)}: no champion to gate v{version} against")
    return champ


def gate(cfg: Config, arm: str, version: str, month: str | None = None) -> GateResult:
    """Challenger ``version`` against the arm's champion. Offline: the paired non-inferiority test of
    ``arms.gate_metric`` on the held-out users (:func:`offline_verdict`: the one-sided (1 - ``arms.gate_alpha``)
    lower bound of the per-user difference > -``arms.gate_margin``, by Tango's score test for HR@K). Off-policy
    (when ``month`` is given and ``arms.gate_ope_margin`` >= 0): the lower bound of the bootstrap interval of the CTR
    difference (challenger - champion) under ``arms.gate_ope_estimator`` on the month's logs
    (:func:`off_policy_gate`) at least -``arms.gate_ope_margin``, the estimate finite and in [0, 1] and both versions'
    effective sample sizes at least ``arms.gate_min_ess`` (:func:`ope_verdict`: fails closed; docs/gate.md
    "Decision"). Both must pass. The held-out users are those of
    :func:`gate_examples`: the configured dataset's (``arms.gate_users = dataset``) or the deployment's own, from the
    warehouse's interactions through ``month`` (``warehouse``; ``month`` is then required). Every number is logged to
    MLflow (experiment abpo-arms, run gate-<arm>-v<version>, linked to the challenger's LoggedModel); the verdict and
    its reason are printed and kept as version tags."""
    champ = month_start_champion(cfg, arm, version)
    key, done = completed_step(
        cfg, "gate", arm, f"v{version}", f"champion-v{champ.version}", month or "offline", result=GateResult
    )
    if done is not None:
        log.info(f"gate {arm}: {'PASS' if done.passed else 'FAIL'}: {done.reason}")
        return done
    from abpo.policy.evaluate import NonFiniteScores

    metric = cfg.arms.gate_metric
    users = gate_examples(cfg, month)  # built once: both versions are scored on these users
    ope = None
    ch: dict[str, float] = {}
    new: dict[str, float] = {}
    who = f"champion v{champ.version}"
    try:
        ch, ch_ranks = offline_scores(cfg, arm, str(champ.version), gate_set=users)
        who = f"challenger v{version}"
        new, new_ranks = offline_scores(cfg, arm, str(version), gate_set=users)
    except NonFiniteScores as e:  # NaN weights or an overflow: no rank means anything, the gate fails closed
        verdict = GateVerdict(
            False,
            False,
            True,
            f"offline {metric}: {arm_versions.model_name(arm, cfg)} {who}: {e}: fails closed (non_finite_scores)",
        )
    else:
        if month is not None and cfg.arms.gate_ope_margin >= 0:
            ope = off_policy_gate(cfg, arm, str(version), month, champion=str(champ.version))
            ope["margin"] = cfg.arms.gate_ope_margin
            ope["row_set"] = cfg.arms.gate_ope_rows  # heldout: the held-out users' rows; all: every row
        verdict = gate_verdict(
            metric=metric,
            challenger_ranks=new_ranks,
            champion_ranks=ch_ranks,
            margin=cfg.arms.gate_margin,
            alpha=cfg.arms.gate_alpha,
            power=cfg.arms.gate_power,
            challenger_version=str(version),
            champion_version=str(champ.version),
            ope=ope,
            ope_margin=cfg.arms.gate_ope_margin,
            min_ess=cfg.arms.gate_min_ess,
            month=month,
            max_top_share=cfg.arms.gate_max_top_weight_share,
            primary=cfg.arms.gate_primary,
            guardrail_margin=cfg.arms.gate_guardrail_margin,
        )
    passed, reason = verdict.passed, verdict.reason
    decided = decided_by(cfg.arms.gate_primary, ope)
    log.info(f"gate {arm}: {'PASS' if passed else 'FAIL'}: {reason}")
    arm_versions.set_tags(
        cfg,
        arm,
        version,
        {
            "gate.verdict": "pass" if passed else "fail",
            "gate.reason": reason[:4900],
            "gate.champion_version": champ.version,
            "gate.decided_by": decided,
            **({"gate.guardrail.margin": f"{cfg.arms.gate_guardrail_margin:.6g}"} if decided == "off-policy" else {}),
            **offline_tags(metric, verdict.offline),
            **ope_tags(ope, cfg.arms.gate_ope_margin),
        },
    )
    numbers = {f"offline.challenger.{k.replace('@', '_at_')}": v for k, v in new.items()}
    numbers.update({f"offline.champion.{k.replace('@', '_at_')}": v for k, v in ch.items()})
    numbers.update(ope_metrics(ope))
    numbers.update({f"offline.paired.{k}": float(v) for k, v in verdict.offline.items() if k in PAIRED_NUMBERS})
    if "upper" in verdict.offline:  # the guardrail's one-sided upper bound, beside the margin it was held to
        numbers["offline.guardrail.upper"] = float(verdict.offline["upper"])
        numbers["offline.guardrail.margin"] = float(cfg.arms.gate_guardrail_margin)
        numbers["offline.guardrail.passed"] = float(bool(verdict.offline_passed))
    if ope:
        numbers["ope.margin"] = float(cfg.arms.gate_ope_margin)
    numbers["passed"] = float(passed)
    with start_run(
        cfg,
        f"gate-{arm}-v{version}",
        {
            "abpo.arm": arm,
            "abpo.month": month or "",
            "abpo.challenger": version,
            "abpo.champion": str(champ.version),
            "abpo.verdict": reason[:4900],
            registry.TASK_KEY_TAG: key,
        },
    ) as run:
        # the gate run's metrics, linked to the challenger's LoggedModel too (the MLflow UI compares models on them)
        registry.log_model_metrics(arm_versions.get_version(cfg, arm, version), numbers, run_id=run.info.run_id)
    out = GateResult(
        arm=arm,
        version=str(version),
        champion_version=str(champ.version),
        passed=passed,
        reason=reason,
        metric=metric,
        challenger=new,
        champion=ch,
        off_policy=finite_or_none(ope),
        offline=finite_or_none(verdict.offline) or None,
        offline_passed=verdict.offline_passed,
        ope_passed=verdict.ope_passed,
        decided_by=decided,
    )
    registry.record_task_result(run.info.run_id, out.to_json())
    return out
