"""What the cells of one seed share: pi_init(seed) (trained once per data, policy, SFT and seed in the shared
store <root>/experiments/_pi_init/<key>), the rounds' windows of update positions, pi_init's logs of them, and the
seed's loaded data (SeedContext)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.data.candidates import build_bandit_requests, training_popularity
from abpo.data.splits import split_users
from abpo.experiment.evaluation import eval_examples_for
from abpo.experiment.rows import experiment_config
from abpo.months import Month
from abpo.policy.model import load_policy

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger("abpo.experiment.runner")  # the experiment's progress lines keep the runner's logger

# policy settings that do not change pi_init (its key leaves them out, so a sweep of tau reuses it)
PI_INIT_INDEPENDENT = ("tau", "num_threads", "constrained_rollouts", "scoring_batch_tokens")


def experiments_root(cfg: Config) -> Path:
    return cfg.paths.resolve("root") / "experiments"


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pi_init_key(cfg: Config, seed: int) -> str:
    """What pi_init(seed) depends on: the data, the policy's model and prompt settings, the SFT settings, the seed
    and the validation users (early stopping)."""
    policy = {k: v for k, v in dataclasses.asdict(cfg.policy).items() if k not in PI_INIT_INDEPENDENT}
    return digest(
        {
            "data": dataclasses.asdict(cfg.data),
            "policy": policy,
            "sft": dataclasses.asdict(cfg.sft),
            "seed": int(seed),
            "validation_fraction": cfg.experiment.validation_fraction,
        }
    )


def seed_config(cfg: Config, seed: int) -> Config:
    """The config of one seed: its seed, and its state directory (the shared pi_init store, where its SFT writes
    ``models/pi_init``)."""
    store = experiments_root(cfg) / "_pi_init" / pi_init_key(cfg, seed)
    c = dataclasses.replace(cfg, seed=int(seed))
    c.paths = dataclasses.replace(cfg.paths, root=str(store))
    c.sft = dataclasses.replace(cfg.sft, output="pi_init")
    return c


def round_positions(n_update: int, r: int, rounds: int) -> range:
    """Window r (1-based) of R: the indices i (t' = T + i) of a user's n_update update positions, cut into R
    consecutive windows of near-equal length (numpy.array_split's rule: the first n mod R windows one longer)."""
    if not 1 <= r <= rounds:
        raise ValueError(f"round {r}: rule: 1..{rounds}")
    base, extra = divmod(n_update, rounds)
    start = (r - 1) * base + min(r - 1, extra)
    return range(start, start + base + (1 if r <= extra else 0))


def round_month(month: str, r: int) -> str:
    """The month stamped on round r's log: experiment.month, then one month per round."""

    return str(Month.parse(month, "experiment.month").plus(r - 1))


@dataclass
class SeedContext:
    """Everything a seed's cells share (loaded in the worker process)."""

    cfg: Config  # the seed's config (seed_config)
    store: Path  # the shared pi_init store of this seed (<root>/experiments/_pi_init/<key>)
    dataset: Any
    splits: list
    eval_examples: list
    popularity: dict[int, int]
    pi_init_dir: Path
    requests: list  # every D_bandit request t' in {T..T+N-2} of every user (build_bandit_requests)

    def window(self, r: int, rounds: int) -> list:
        """The requests of round r's window (round_positions) of every user."""
        first = {s.user_id: len(s.history) for s in self.splits}
        n_upd = {s.user_id: len(s.update) for s in self.splits}
        keep = []
        for ex in self.requests:
            i = len(ex.history) - first[ex.user_id]
            if i in round_positions(n_upd[ex.user_id], r, rounds):
                keep.append(ex)
        return keep


def pi_init_log_path(ctx: SeedContext, r: int, rounds: int) -> Path:
    """pi_init's log of round r's window (shared: No-Update's rounds, every row's round 1, the baselines)."""
    tau = ctx.cfg.policy.tau
    return ctx.store / "d_bandit" / f"r{r}of{rounds}-tau{tau:g}-m{ctx.cfg.experiment.month}.parquet"


def log_window(ctx: SeedContext, model, tokenizer, r: int, rounds: int, model_version: str):
    """Round r's D_bandit: ``model`` logs one exposure per request of window r (a ~ e(.|q) at policy.tau)."""
    from abpo.policy.bandit import build_bandit_log

    return build_bandit_log(
        ctx.cfg,
        month=round_month(ctx.cfg.experiment.month, r),
        arm="abpo",
        model=model,
        tokenizer=tokenizer,
        dataset=ctx.dataset,
        write=False,
        progress=False,
        model_version=model_version,
        requests=ctx.window(r, rounds),
        rng_stream=7 + 1000 * (r - 1),
    )


def write_parquet(table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def load_model(ctx: SeedContext, model_dir: Path):

    model, tok = load_policy(
        dataclasses.replace(ctx.cfg.policy, model=str(model_dir)), ctx.cfg.paths, dataset=ctx.dataset
    )
    model.eval()
    return model, tok


def pi_init_log(ctx: SeedContext, r: int, rounds: int, model=None, tokenizer=None):
    """pi_init's log of window r, computed once per (seed, pi_init, tau, window) and kept in the store."""
    import pyarrow.parquet as pq

    path = pi_init_log_path(ctx, r, rounds)
    if not path.exists():
        if model is None:
            model, tokenizer = load_model(ctx, ctx.pi_init_dir)
        write_parquet(log_window(ctx, model, tokenizer, r, rounds, f"pi_init-seed{ctx.cfg.seed}"), path)
    return pq.read_table(path)


def load_seed(cfg: Config, seed: int) -> SeedContext:
    from abpo.data.loaders import load_dataset

    cfg = experiment_config(cfg)
    c = seed_config(cfg, seed)
    ds = load_dataset(c.data)
    splits, _ = split_users(ds, c.data)
    return SeedContext(
        cfg=c,
        store=c.paths.resolve("root"),
        dataset=ds,
        splits=splits,
        eval_examples=eval_examples_for(c, splits, ds),
        popularity=training_popularity(splits, ds),
        pi_init_dir=c.paths.resolve("models") / "pi_init",
        requests=build_bandit_requests(splits, ds, c.data),
    )
