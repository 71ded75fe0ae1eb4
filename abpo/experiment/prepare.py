"""A seed's preparation, once for every cell of the seed: pi_init(seed) (abpo.experiment.seeds) and its logs of every
round's window under the regime (abpo.experiment.regimes.shared_log), kept in the shared store; a second experiment
preparing the same seed at the same time waits on the store's lock, then reuses them."""

from __future__ import annotations

import fcntl
import logging
import time
from typing import TYPE_CHECKING, Any

from abpo.experiment.regime_settings import shared_kind
from abpo.experiment.regimes import shared_log, shared_log_path
from abpo.experiment.rows import experiment_config
from abpo.experiment.seeds import load_model, load_seed, seed_config
from abpo.logs import quiet
from abpo.policy.sft import train_sft

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger("abpo.experiment.runner")  # the experiment's progress lines keep the runner's logger


def prepare_seed(cfg: Config, seed: int) -> dict[str, Any]:
    """pi_init(seed) and its logs of every round's window, each computed once (kept in the shared store; a second
    experiment preparing the same seed at the same time waits on the store's lock, then reuses them)."""
    cfg = experiment_config(cfg)
    c = seed_config(cfg, seed)
    store = c.paths.resolve("root")
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(cfg, c, seed)


def _prepare_locked(cfg: Config, c: Config, seed: int) -> dict[str, Any]:

    ctx = load_seed(cfg, seed)
    done: dict[str, Any] = {}
    if not (ctx.pi_init_dir / "abpo_sft.json").exists():
        log.info(f"[seed {seed}] pi_init: next-item pre-training + SFT on D_sup ...")
        t0 = time.time()
        with quiet("abpo.policy"):  # the per-epoch lines of every seed at once would drown the cells' progress
            train_sft(
                c,
                validation_fraction=c.experiment.validation_fraction,
                dataset=ctx.dataset,
                log_mlflow=False,
                register=False,
                evaluate=False,
            )
        done["sft_seconds"] = round(time.time() - t0, 1)
    rounds = cfg.experiment.rounds
    kind = shared_kind(ctx.cfg)  # pi_init's logs, or the regime's row-independent logger's
    t1 = time.time()
    model = tokenizer = None
    if kind == "pi_init" and not all(shared_log_path(ctx, r, rounds, kind).exists() for r in range(1, rounds + 1)):
        model, tokenizer = load_model(ctx, ctx.pi_init_dir)  # once for every missing window
    rows = clicks = 0
    for r in range(1, rounds + 1):
        t = shared_log(ctx, r, rounds, kind, model, tokenizer)
        rows += t.num_rows
        clicks += int(sum(t.column("clicked").to_pylist()))
    done["bandit_seconds"] = round(time.time() - t1, 1)
    log.info(
        f"[seed {seed}] pi_init and its D_bandit ready ({rows} logged rows over {rounds} round(s), {clicks} clicks"
        f", logged by {kind})"
    )
    return {"seed": seed, "rows": rows, "clicks": clicks, **done}
