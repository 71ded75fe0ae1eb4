"""Is the simulated A/B valid? The four arms' current models (their champions in the registry: run `make demo`
first, or name another config's state with --config/--set) ranked two ways on the same users:

    offline HR@5      each split user's held-out target x_{T+N} among data.eval_candidates candidates (the
                      offline construction, abpo.data.candidates.build_eval_examples), ranked by the arm's
                      exposure distribution (the same scores that serve; ties count against the target)
    simulated CTR     every arm serves every user the same month's requests (abpo.sim.simulate_month with that
                      arm at share 1: same candidates, same pre-drawn uniforms, same click model), nothing landed

and the Kendall rank correlation (tau-b) between the two orders. The goal (issue: a production A/B worth reading)
is tau >= 0.67, at most one swapped pair of four, by construction of the simulator, not by tuning the arms.

Then the robustness table (docs/simulator.md): the same arms' simulated CTR under each ground truth, the config's
``sim.oracle`` first, the mixture (with the config's weights: knn and sequential by default, the ALS component at 0,
and the former default with it: ``mixture:knn+sequential+als``), each pure component (als, knn, sequential) and the
replay truth (only the users' real next items), with the tau against the offline order under each, as a markdown
table. Each arm serves once: its exposures do not depend on the oracle
(the same requests and pre-drawn uniforms), only the clicks do.

    .venv/bin/python benchmarks/simulate.py [--config demo] [--month 2026-02] [--oracles mixture,als,replay,...]
                                            [--exposure-temperature 1,0.25] [--set key=value ...] [--smoke]

Then the concordance check: the clear pairs of arms offline, those whose HR@5 difference is at least 2
standard errors of the paired per-user difference or at least 0.03 (:func:`clear_pairs`), and, under each oracle,
Kendall's tau-b and how many clear pairs keep their order in simulated CTR and which reverse it. Pairs within noise
offline may swap; a clear pair should not, when the clicks come from the users' own taste.

Then the yardstick table: two things bias the offline-vs-simulated comparison above, so beside offline
HR@5 and simulated CTR every arm's champion is measured on the same month's requests by

    served HR@5       HR@5 on the served candidates: the arm ranks each of the month's retrieval-stage candidate
                      sets (the requests abpo.sim.simulator.month_requests serves, by its exposure probabilities,
                      ties against), hit = the user's real next item x_{t'+1} in its top 5 (:func:`served_hits_at`).
                      A request whose next item the retrieval stage did not serve (or that is in the history, which
                      candidates never repeat) is a miss for every arm and stays in the denominator: the figure is
                      P(served and in the top 5) over the month's requests; the header gives the share that could
                      be hit (:func:`coverage`), by which the figure divides to read it among those requests alone
    E[CTR] own T      Eq. H1 of abpo.sim.headroom (the click model's expected CTR, no click noise) of the arm's own
                      exposure: the LLM arms at policy.tau, the rankers at their T (ML-retrain 0.1 by default)
    E[CTR] t=<t>      Eq. H1 with every arm's scores through softmax(score / t) at one common t
                      (``--exposure-temperature``, default policy.tau): the rankers' scores as they expose them,
                      the LLM arms' s_p (:func:`exposure_at`, from the arm's own exposure)
    E[CTR] top choice Eq. H1 of the greedy exposure: each arm's top candidate (:func:`top_choice`)

with each arm's own exposure temperature, Kendall's tau-b of each yardstick against offline HR@5, and the
concordance of two sets of clear pairs under every yardstick (kept / reversed; reversed pairs named below the
table): the offline clear pairs above and the clear pairs by served HR@5 (per user, the mean of their requests'
hits). Eq. H1 reads the config's ``sim.oracle``, with the link's intercept calibrated on the month's requests as
simulate_month calibrates it (abpo.sim.headroom.candidate_click_probabilities). Every yardstick reuses the
exposures the arm served the month with: no arm is scored twice.

The last two lines are exactly `Clear pairs under <oracle>: kept <k>/<n>, reversed <r>` and `Kendall tau offline
HR@5 vs simulated CTR: <v>`, both for the config's ``sim.oracle`` (`nan` when either order is constant).

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py) without `make demo`: in a throw-away state
directory, on 12 users and a smaller tiny model, it bootstraps every arm first (abpo.monthly.bootstrap.bootstrap_arms:
pi_init by 4 SFT steps, the rankers fitted), then ranks their champions as above (the figures mean nothing at that
size).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

# --smoke: the arms bootstrapped on 12 users with a smaller tiny model (overrides before the command line's --set)
SMOKE = [
    "data.max_users=12",
    "data.sup_examples_per_user=4",
    "data.train_candidates=8",
    "data.eval_candidates=10",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
    "update.max_completion_length=72",  # the catalog's longest answer + EOS in a 2,048-token vocabulary: 69
    "policy.max_history=3",
    "sft.pretrain_epochs=0",
    "sft.max_steps=4",
    "sft.batch_size=8",
    "sft.eval_max_users=4",
    "sft.eval_generation=false",
    "arms.gate_max_users=4",
]


def rank_of(p, j: int) -> int:
    """0-based rank of candidate ``j`` when the candidates are ordered by exposure probability ``p`` (the arm's
    score order), ties counted against it."""
    p = np.asarray(p)
    return int(np.sum(p > p[j])) + int(np.sum(p == p[j])) - 1


def hits_at(k: int, arm, examples) -> np.ndarray:
    """Per example (user), 1 when ``arm`` ranks the target in its top ``k`` by exposure probability (ties counted
    against it), else 0: HR@k is their mean, and two arms' paired difference is taken per user."""
    probs = arm.propensities([(e.user_id, e.history, e.candidates) for e in examples])
    hits = np.zeros(len(examples))
    for n, (e, p) in enumerate(zip(examples, probs, strict=True)):
        hits[n] = rank_of(p, e.candidates.index(e.positive)) < k
    return hits


def served_hits_at(k: int, requests, exposures) -> np.ndarray:
    """HR@k on the served candidates, per request: 1 when the request's real next item x_{t'+1} is among its
    served candidates and the arm's ``exposures`` (one distribution per request, aligned with its candidates) rank
    it in the top ``k`` (ties counted against it), else 0. A request whose next item the retrieval stage did not
    serve is a miss for every arm: it stays in the denominator (HR@k is P(served and in the top k) over the
    month's requests; :func:`coverage` is the share that could be hit)."""
    if len(exposures) != len(requests):
        raise ValueError(f"served_hits_at: {len(exposures)} exposure distributions for {len(requests)} requests")
    hits = np.zeros(len(requests))
    for n, (r, p) in enumerate(zip(requests, exposures, strict=True)):
        if len(p) != len(r.candidates):
            raise ValueError(
                f"served_hits_at: request {r.request_id}: {len(p)} probabilities for {len(r.candidates)} "
                "candidates; rule: one per candidate"
            )
        if r.next_item in r.candidates:
            hits[n] = rank_of(p, r.candidates.index(r.next_item)) < k
    return hits


def coverage(requests) -> float:
    """The share of ``requests`` whose real next item is among their served candidates (the most any arm's
    served HR@k can reach)."""
    return float(np.mean([r.next_item in r.candidates for r in requests])) if requests else float("nan")


def user_means(user_ids, values) -> np.ndarray:
    """Each user's mean of ``values`` (one per request) over their requests, users in ascending id order: per-user
    figures that two arms' paired differences (:func:`clear_pairs`) are taken on."""
    by_user: dict[int, list[float]] = {}
    for u, v in zip(user_ids, values, strict=True):
        by_user.setdefault(int(u), []).append(float(v))
    return np.array([np.mean(by_user[u]) for u in sorted(by_user)])


def exposure_at(p, own: float, t: float) -> np.ndarray:
    """The exposure softmax(score / ``t``) of an arm that exposes ``p`` = softmax(score / ``own``) over a request's
    candidates (rankers: T, their scores as they expose them; LLM arms: policy.tau and s_p): log p = score / own -
    log Z, so score / t = (own / t) log p + a constant, and softmax ignores the constant. Every p > 0 (the arm
    contract, abpo.arms.base.expose); ``t`` = ``own`` gives ``p`` back."""
    if not (own > 0 and t > 0):
        raise ValueError(f"exposure_at: own temperature {own}, t {t}; rule: both > 0")
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(p > 0):
        raise ValueError(f"exposure_at: exposure {p!r}; rule: a non-empty vector with every probability > 0")
    z = np.log(p) * (own / t)
    e = np.exp(z - z.max())
    return e / e.sum()


def top_choice(p) -> np.ndarray:
    """Greedy exposure: all mass on the arm's top candidate by ``p`` (its score order), shared equally by tied
    top candidates (the limit of softmax(score / t) as t -> 0)."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"top_choice: exposure {p!r}; rule: a non-empty vector")
    top = p == p.max()
    return top / top.sum()


def expected_ctr_at(click_probs, exposures, own: float, t: float | None) -> float:
    """Eq. H1 (abpo.sim.headroom.expected_ctr, no click noise) of an arm exposing ``exposures`` at its own
    temperature ``own``, re-exposed at the common temperature ``t`` (:func:`exposure_at`), or by its top choice
    (:func:`top_choice`) when ``t`` is None."""
    from abpo.sim.headroom import expected_ctr

    at = [top_choice(p) if t is None else exposure_at(p, own, t) for p in exposures]
    return expected_ctr(click_probs, at)


def hit_rate_at(k: int, arm, examples) -> float:
    """HR@k of ``arm`` on ``examples``: the target's rank by exposure probability, ties counted against it."""
    return float(hits_at(k, arm, examples).mean())


# a pair of arms is clear offline when its HR@5 difference is at least CLEAR_SE standard errors of the paired
# per-user difference, or at least CLEAR_GAP: such a pair should keep its order in simulated CTR
CLEAR_SE = 2.0
CLEAR_GAP = 0.03


class ClearPair(NamedTuple):
    """Arms ``better`` and ``worse`` by offline HR@5: ``delta`` = HR@5(better) - HR@5(worse) > 0, ``se`` the
    standard error of the mean of the per-user difference (sd with ddof 1 over sqrt(n))."""

    better: str
    worse: str
    delta: float
    se: float


def clear_pairs(hits: dict[str, np.ndarray], *, n_se: float = CLEAR_SE, gap: float = CLEAR_GAP) -> list[ClearPair]:
    """The clear pairs of arms (:data:`CLEAR_SE`, :data:`CLEAR_GAP`) from each arm's per-user hits on the same
    users (``hits[arm][n]`` for user n): d_n = hit_a,n - hit_b,n, delta = mean(d), se = sd(d) / sqrt(n); the pair
    is clear when delta > 0 and (delta >= n_se * se or delta >= gap). A pair whose per-user hits are identical
    (se 0, delta 0) is never clear."""
    arms = list(hits)
    lengths = {a: len(hits[a]) for a in arms}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"clear_pairs: the arms' hits are on different numbers of users: {lengths}")
    out = []
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            d = np.asarray(hits[a], dtype=np.float64) - np.asarray(hits[b], dtype=np.float64)
            delta = float(d.mean()) if d.size else 0.0
            se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
            if delta < 0:
                a_, b_, delta = b, a, -delta
            else:
                a_, b_ = a, b
            if delta > 0 and (delta >= gap - 1e-12 or (se == se and delta >= n_se * se - 1e-12)):
                out.append(ClearPair(a_, b_, delta, se))
    return out


def concordance(pairs: list[ClearPair], ctr: dict[str, float]) -> tuple[list[ClearPair], list[ClearPair], list]:
    """The clear ``pairs`` that keep their order in simulated CTR (``ctr[better] > ctr[worse]``), that reverse it
    (``<``) and that tie, under one oracle."""
    kept = [p for p in pairs if ctr[p.better] > ctr[p.worse]]
    reversed_ = [p for p in pairs if ctr[p.better] < ctr[p.worse]]
    tied = [p for p in pairs if ctr[p.better] == ctr[p.worse]]
    return kept, reversed_, tied


def concordance_lines(pairs: list[ClearPair], ctr: dict[str, dict[str, float]], oracles, taus) -> list[str]:
    """The printed check: per oracle, Kendall's tau-b and how many clear pairs keep / reverse / tie their order,
    each reversed pair named with its offline and simulated differences."""
    lines = [
        f"Clear pairs offline (HR@5 difference >= {CLEAR_SE:g} SE of the paired per-user difference, or >= "
        f"{CLEAR_GAP:g}): {len(pairs)}"
        + "".join(f"\n  {p.better} > {p.worse}: {p.delta:+.4f} (SE {p.se:.4f})" for p in pairs)
    ]
    for o in oracles:
        by_arm = {a: v[o] for a, v in ctr.items()}
        kept, rev, tied = concordance(pairs, by_arm)
        lines.append(
            f"concordance {o}: tau {taus[o]:.2f}; clear pairs kept {len(kept)}/{len(pairs)}, reversed {len(rev)}"
            + (f", tied {len(tied)}" if tied else "")
            + "".join(
                f"\n  reversed: {p.better} > {p.worse} offline ({p.delta:+.4f}) but sim CTR "
                f"{by_arm[p.better]:.4f} < {by_arm[p.worse]:.4f}"
                for p in rev
            )
        )
    return lines


ORACLES = ("mixture", "mixture:knn+sequential+als", "als", "knn", "sequential", "replay")


def oracle_settings(sim_cfg, oracle: str):
    """``sim_cfg`` with the ground truth ``oracle``: a ``sim.oracle`` name (the mixture with the config's
    weights), or ``mixture:<c1>+<c2>...``, the mixture of those components at equal weights (the others at 0), e.g.
    ``mixture:knn+sequential+als`` (the former default, with the ML-retrain arm's family)."""
    name, _, parts = oracle.partition(":")
    if not parts:
        return dataclasses.replace(sim_cfg, oracle=name)
    if name != "mixture":
        raise ValueError(f"--oracles {oracle!r}: rule: only mixture takes components (mixture:knn+sequential)")
    return dataclasses.replace(sim_cfg, oracle=name, oracle_weights={c: 1.0 for c in parts.split("+")})


class ServedOnce:
    """``arm`` whose exposure distributions are computed once per request list: serving the same month under
    another oracle reuses them (the arm's output does not depend on the oracle, which only the clicks read)."""

    def __init__(self, arm):
        self.arm = arm
        self.name, self.model_version, self.logging_policy = arm.name, arm.model_version, arm.logging_policy
        self.temperature = getattr(arm, "temperature", None)  # the arm's exposure temperature (T or policy.tau)
        self._memo: dict[tuple, list] = {}

    def propensities(self, requests):
        key = tuple((int(u), tuple(h), tuple(c)) for u, h, c in requests)
        if key not in self._memo:
            self._memo[key] = self.arm.propensities(requests)
        return self._memo[key]


def simulated_ctr_by_oracle(
    cfg, month: str, name: str, arm, *, dataset, splits, oracles=ORACLES, requests=None
) -> dict[str, dict]:
    """Arm ``name``'s per-arm result (impressions, clicks, ctr) of ``month`` with ``arm`` at share 1, under each
    ground truth in ``oracles`` (``sim.oracle`` set to it; everything else as ``cfg``). ``requests``: the month's
    (abpo.sim.simulator.month_requests), when the caller built them; ``arm`` may be a :class:`ServedOnce` the
    caller keeps, to read the same exposures afterwards."""
    from abpo.sim.simulator import month_requests, simulate_month

    served = arm if isinstance(arm, ServedOnce) else ServedOnce(arm)
    if requests is None:
        requests = month_requests(cfg, dataset, splits, month)  # the same whatever the oracle: built once
    out = {}
    for oracle in oracles:
        one = dataclasses.replace(
            cfg,
            report=dataclasses.replace(cfg.report, arm_shares={name: 1.0}),
            sim=oracle_settings(cfg.sim, oracle),
        )
        out[oracle] = simulate_month(
            one, month, {name: served}, dataset=dataset, splits=splits, write=False, requests=requests
        ).per_arm[name]
    return out


def kendall_tau(x, y) -> float:
    """Kendall's tau-b of two orders (nan when either is constant)."""
    from scipy.stats import kendalltau

    return float(kendalltau(list(x), list(y)).statistic)


def robustness_table(
    hit_rates: dict[str, float], ctr: dict[str, dict[str, float]], oracles=ORACLES
) -> tuple[list[str], dict[str, float]]:
    """The markdown robustness table (one row per arm: offline HR@5 and the simulated CTR under each oracle; a last
    row with Kendall's tau of each oracle's CTR order against the HR@5 order) and the taus by oracle."""
    arms = list(hit_rates)
    taus = {o: kendall_tau([hit_rates[a] for a in arms], [ctr[a][o] for a in arms]) for o in oracles}
    lines = [
        "| arm | offline HR@5 | " + " | ".join(f"sim CTR {o}" for o in oracles) + " |",
        "|---|---:|" + "---:|" * len(oracles),
    ]
    for a in arms:
        lines.append(f"| {a} | {hit_rates[a]:.4f} | " + " | ".join(f"{ctr[a][o]:.4f}" for o in oracles) + " |")
    lines.append("| Kendall tau vs HR@5 | | " + " | ".join(f"{taus[o]:.2f}" for o in oracles) + " |")
    return lines, taus


OFFLINE = "offline HR@5"
SERVED = "served HR@5"
OWN = "E[CTR] own T"
TOP = "E[CTR] top choice"


def common_t_name(t: float) -> str:
    """The yardstick name of Eq. H1 at the common exposure temperature ``t``."""
    return f"E[CTR] t={t:g}"


def arm_yardsticks(requests, exposures, click_probs, own: float, temperatures) -> tuple[dict[str, float], np.ndarray]:
    """One arm's yardsticks on one month's served ``requests`` (its ``exposures`` at its own temperature ``own``,
    the click model's ``click_probs``, abpo.sim.headroom.candidate_click_probabilities): served HR@5
    (:func:`served_hits_at`), Eq. H1 at its own temperature, at each common temperature in ``temperatures``
    (:func:`exposure_at`) and by its top choice (:func:`top_choice`); and its served hits per user
    (:func:`user_means`, for the served clear pairs)."""
    hits = served_hits_at(5, requests, exposures)
    out = {SERVED: float(hits.mean()), OWN: expected_ctr_at(click_probs, exposures, own, own)}
    for t in temperatures:
        out[common_t_name(t)] = expected_ctr_at(click_probs, exposures, own, t)
    out[TOP] = expected_ctr_at(click_probs, exposures, own, None)
    return out, user_means([r.user_id for r in requests], hits)


def yardstick_table(
    values: dict[str, dict[str, float]], yardsticks, pairs_by: dict[str, list[ClearPair]], own: dict[str, float]
) -> tuple[list[str], dict[tuple[str, str], tuple[list, list, list]]]:
    """The markdown yardstick table: one row per arm (its own exposure temperature, then ``values[arm][y]`` for
    each of ``yardsticks``, the first of which is offline HR@5), a row with Kendall's tau-b of each yardstick's
    order against the first's, and per source of clear pairs in ``pairs_by`` (a yardstick name -> its clear pairs)
    a row with how many keep / reverse their order under each other yardstick (tied ones noted). Returns the lines
    and the concordance, (source, yardstick) -> (kept, reversed, tied)."""
    arms = list(values)
    ys = list(yardsticks)
    head = [values[a][ys[0]] for a in arms]
    lines = ["| arm | own T | " + " | ".join(ys) + " |", "|---|---:|" + "---:|" * len(ys)]
    for a in arms:
        lines.append(f"| {a} | {own[a]:g} | " + " | ".join(f"{values[a][y]:.4f}" for y in ys) + " |")
    taus = [kendall_tau(head, [values[a][y] for a in arms]) for y in ys[1:]]
    lines.append(f"| Kendall tau vs {ys[0]} | | |" + "".join(f" {t:.2f} |" for t in taus))
    conc = {}
    for source, pairs in pairs_by.items():
        cells = []
        for y in ys:
            if y == source:
                cells.append("-")
                continue
            kept, rev, tied = concordance(pairs, {a: values[a][y] for a in arms})
            conc[(source, y)] = (kept, rev, tied)
            cells.append(f"{len(kept)} / {len(rev)}" + (f" ({len(tied)} tied)" if tied else ""))
        lines.append(f"| {source} clear pairs ({len(pairs)}) kept / reversed | | " + " | ".join(cells) + " |")
    return lines, conc


def reversed_lines(conc: dict[tuple[str, str], tuple[list, list, list]], values) -> list[str]:
    """Each clear pair that a yardstick reverses, named with both yardsticks' figures."""
    out = []
    for (source, y), (_, rev, _) in conc.items():
        for p in rev:
            out.append(
                f"  {source} {p.better} > {p.worse} ({p.delta:+.4f}, SE {p.se:.4f}) but {y} "
                f"{values[p.better][y]:.4f} < {values[p.worse][y]:.4f}"
            )
    return out


def parse_temperatures(text: str) -> list[float]:
    """``--exposure-temperature``: comma-separated temperatures, each finite and > 0 (empty: none given)."""
    out = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            t = float(part)
        except ValueError:
            t = float("nan")
        if not (np.isfinite(t) and t > 0):
            raise SystemExit(f"--exposure-temperature {text!r}: {part!r}; rule: comma-separated numbers > 0")
        out.append(t)
    return out


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset whose registry holds the champions (default demo)")
    ap.add_argument(
        "--month",
        default="",
        help="the month whose requests are served (default: the last month the "
        "config's data.update_steps // sim.window allows)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument(
        "--oracles",
        default=",".join(ORACLES),
        help="ground truths of the robustness table, comma separated (the config's sim.oracle is always first): "
        "sim.oracle names, or mixture:<c1>+<c2> for the mixture of those components alone",
    )
    ap.add_argument(
        "--exposure-temperature",
        default="",
        metavar="T[,T...]",
        help="the common exposure temperature(s) t of the yardstick table's E[CTR] t=<t> columns (every arm's "
        "scores through softmax(score / t)), comma separated (default: the config's policy.tau, the LLM arms' own)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="bootstrap the arms of a tiny throw-away state first and rank them (seconds; the figures mean nothing)",
    )
    args = ap.parse_args(argv)
    temperatures = parse_temperatures(args.exposure_temperature)

    import tempfile

    from abpo.arms import versions
    from abpo.config import load_config
    from abpo.data.candidates import build_eval_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.months import Month
    from abpo.sim.headroom import candidate_click_probabilities
    from abpo.sim.simulator import month_requests, months_available

    if args.smoke:
        state = tempfile.mkdtemp(prefix="abpo-bench-simulate-")
        cfg = load_config(args.config, [*SMOKE, f"paths.root={state}", *args.set])
        from abpo.logs import quiet
        from abpo.monthly.bootstrap import bootstrap_arms

        with quiet():
            bootstrap_arms(cfg)
        print(f"--smoke: every arm bootstrapped in {state} (removed at the end)")
    else:
        cfg = load_config(args.config, args.set)
    ds = load_dataset(cfg.data)
    splits, _ = split_users(ds, cfg.data)
    month = args.month or str(Month(cfg.sim.start_month).plus(months_available(cfg) - 1))
    examples = build_eval_examples(splits, ds, cfg.data)
    default = cfg.sim.oracle
    oracles = [default, *[o for o in (x.strip() for x in args.oracles.split(",")) if o and o != default]]
    temperatures = temperatures or [float(cfg.policy.tau)]
    requests = month_requests(cfg, ds, splits, month)  # every arm serves these, under every oracle
    served = [(r.user_id, r.history, r.candidates) for r in requests]
    click_probs, _ = candidate_click_probabilities(cfg, ds, requests)  # Eq. H1's p_r(a) under the config's truth
    rows = []
    ctr: dict[str, dict[str, float]] = {}
    hits: dict[str, np.ndarray] = {}
    yard: dict[str, dict[str, float]] = {}
    served_hits: dict[str, np.ndarray] = {}
    own: dict[str, float] = {}
    for name in cfg.arms.names:  # the config's arms (a state bootstraps only those)
        arm = ServedOnce(versions.load_arm(cfg, name, ds))
        t = time.perf_counter()
        hits[name] = hits_at(5, arm, examples)
        hr = float(hits[name].mean())
        by_oracle = simulated_ctr_by_oracle(
            cfg, month, name, arm, dataset=ds, splits=splits, oracles=oracles, requests=requests
        )
        ctr[name] = {o: r["ctr"] for o, r in by_oracle.items()}
        a = by_oracle[default]
        own[name] = float(arm.temperature)
        y, served_hits[name] = arm_yardsticks(requests, arm.propensities(served), click_probs, own[name], temperatures)
        yard[name] = {OFFLINE: hr, f"sim CTR {default}": a["ctr"], **y}
        rows.append((name, arm.model_version, hr, a["ctr"], a["impressions"], time.perf_counter() - t))
    print(
        f"{len(examples)} users; offline: M = {cfg.data.eval_candidates} (hard-negative fraction "
        f"{cfg.data.eval_hard_negative_fraction}); simulated month {month}: {rows[0][4]} requests per arm, "
        f"candidates {cfg.sim.candidates} (M = {cfg.sim.candidate_count})"
    )
    print(f"{'arm':<11} {'version':>7} {'HR@5':>7} {'sim CTR':>8} {'seconds':>8}   (sim CTR: sim.oracle = {default})")
    for name, v, hr, c, _, sec in rows:
        print(f"{name:<11} {v:>7} {hr:>7.4f} {c:>8.4f} {sec:>8.1f}")
    lines, taus = robustness_table({r[0]: r[2] for r in rows}, ctr, oracles)
    print(f"\nRobustness: simulated CTR under each ground truth (sim.oracle; {default} is the config's)\n")
    print("\n".join(lines))
    print()
    pairs = clear_pairs(hits)
    print("\n".join(concordance_lines(pairs, ctr, oracles, taus)))
    print()
    ys = [OFFLINE, SERVED, f"sim CTR {default}", OWN, *map(common_t_name, temperatures), TOP]
    served_pairs = clear_pairs(served_hits)
    ylines, yconc = yardstick_table(yard, ys, {OFFLINE: pairs, SERVED: served_pairs}, own)
    print(
        f"Yardsticks on the {len(requests)} served requests of {month}:\n"
        f"  {SERVED}: each arm ranks the retrieval stage's candidates; the user's real next item is among them in "
        f"{coverage(requests):.1%} of the requests, the others are misses for every arm\n"
        f"  E[CTR]: Eq. H1 under {default} (no click noise) at each arm's own exposure temperature (own T), at one "
        f"common t for every arm (softmax(score / t)) and by its top choice\n"
    )
    print("\n".join([*ylines, *reversed_lines(yconc, yard)]))
    print()
    if args.smoke:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    kept, rev, _ = concordance(pairs, {a: v[default] for a, v in ctr.items()})
    print(f"Clear pairs under {default}: kept {len(kept)}/{len(pairs)}, reversed {len(rev)}")
    print(f"Kendall tau offline HR@5 vs simulated CTR: {taus[default]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
