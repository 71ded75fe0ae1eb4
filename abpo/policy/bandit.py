"""Synthetic D_bandit: docs/ABPO_SPEC.md "Offline construction", written as impressions.

For each user and t' in {T..T+N-2} (``abpo.data.candidates.build_bandit_requests``: C_{t'} = {x_{t'+1}} + M-1
unseen distractors, never x_{T+N}): score all M candidates with pi_init (Eq. s_p), e0 = softmax(s/tau) (Eq. e_p),
sample a_log ~ Categorical(e0), store e0(a_log|q), and y = 1 iff a_log = x_{t'+1} (y = 0 is "no positive
response", not a negative label).

The rows follow ``abpo.data.schemas.IMPRESSIONS_SCHEMA`` and are landed with ``write_impressions`` under
landing/impressions/month=YYYY-MM/, so the warehouse ingests them exactly like served traffic.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from abpo import registry
from abpo.data.candidates import build_bandit_requests
from abpo.data.loaders import load_dataset
from abpo.data.schemas import IMPRESSIONS_SCHEMA, SCHEMA_VERSION, check_month, write_impressions
from abpo.data.splits import split_users
from abpo.months import Month
from abpo.policy.model import load_policy
from abpo.policy.sft import PI_INIT_ALIAS

if TYPE_CHECKING:
    from abpo.config import Config

OFFLINE_PART = "offline-pi_init"


def _month_times(month: str, n: int) -> list[datetime]:
    """n timestamps spread evenly over the month (deterministic)."""

    start, end = Month.parse(month).bounds()
    step = (end - start).total_seconds() / max(n, 1)
    return [start + timedelta(seconds=int(i * step)) for i in range(n)]


def build_bandit_log(
    cfg: Config,
    *,
    month: str = "2024-01",
    arm: str = "abpo",
    model=None,
    tokenizer=None,
    dataset: Any = None,
    model_version: str | None = None,
    write: bool = True,
    progress: bool | str = "simulate log",
    requests: list | None = None,
    rng_stream: int = 7,
) -> pa.Table:
    """Build D_bandit with the logging policy pi_init (the SFT output ``<paths.models>/<sft.output>`` unless
    ``model``/``tokenizer`` are given) and return it in IMPRESSIONS_SCHEMA (one row per request, ``arm``); with
    ``write`` also land it for ``month`` (part ``offline-pi_init``: a rerun replaces it). ``requests``: log these
    D_bandit requests instead of every one (the experiment's rounds log one window of each user's update positions
    per round). Draws are seeded by (``cfg.seed``, ``rng_stream``)."""
    import dataclasses

    from abpo.policy.scoring import candidate_propensities, sample_logged_action, score_examples

    check_month(month)
    ds = dataset if dataset is not None else load_dataset(cfg.data)
    if model is None or tokenizer is None:
        init_dir = cfg.paths.resolve("models") / cfg.sft.output
        if not (init_dir / "config.json").exists():
            raise FileNotFoundError(f"{init_dir}: pi_init not found; run `abpo sft --config {cfg.name}` first")
        model, tokenizer = load_policy(dataclasses.replace(cfg.policy, model=str(init_dir)), cfg.paths, dataset=ds)
        model_version = model_version or _registered_pi_init(cfg)
    if requests is None:
        splits, _ = split_users(ds, cfg.data)
        requests = build_bandit_requests(splits, ds, cfg.data)
    if not requests:
        raise ValueError(f"{ds.name}: no bandit requests (data.update_steps={cfg.data.update_steps})")
    scored = score_examples(model, tokenizer, requests, ds.titles(), cfg.policy, progress=progress)
    rng = np.random.default_rng([int(cfg.seed), int(rng_stream)])
    times = _month_times(month, len(scored))
    cols: dict[str, list] = {f.name: [] for f in IMPRESSIONS_SCHEMA}
    tau = cfg.policy.tau
    for s, ts in zip(scored, times, strict=True):
        ex = s.example
        e0 = candidate_propensities(s.scores, tau)  # Eq. e_p with the logging policy pi_init
        j, p = sample_logged_action(e0.numpy(), rng)  # a_log ~ Categorical(e0), p = e0(a_log|q)
        a_log = int(ex.candidates[j])
        cols["impression_id"].append(f"{month}:{arm}:{ex.request_id}")
        cols["event_time"].append(ts)
        cols["user_id"].append(int(ex.user_id))
        cols["arm"].append(arm)
        cols["model_version"].append(str(model_version or "pi_init"))
        cols["history"].append([int(i) for i in ex.history])
        cols["candidates"].append([int(c) for c in ex.candidates])
        cols["item_id"].append(a_log)
        cols["propensity"].append(p)
        cols["clicked"].append(int(a_log == ex.positive))  # y = 1 iff a_log = x_{t'+1}
        cols["request_id"].append(ex.request_id)
        cols["position"].append(0)
        cols["logging_policy"].append(f"softmax(tau={tau})")
        cols["served_at"].append(ts)
        cols["schema_version"].append(SCHEMA_VERSION)
    table = pa.table(cols, schema=IMPRESSIONS_SCHEMA)
    if write:
        write_impressions(table, cfg.paths.location("landing"), month, part=f"{OFFLINE_PART}-{arm}")
    return table


def _registered_pi_init(cfg: Config) -> str | None:
    """Version number of the registered pi_init (alias ``pi_init``), if any."""
    mv = registry.get_version(PI_INIT_ALIAS, name=registry.model_name(cfg), cfg=cfg)
    return str(mv.version) if mv is not None else None
