"""One monthly update of one arm: D_bandit from the warehouse -> ABPOTrainer -> a LoRA checkpoint + MLflow run.

    run_update(cfg, UpdateRun(variant, arm, months, init_model, output))  ->  UpdateResult(adapter_dir, model_dir, ...)

``cfg`` (section ``update``) says how to train; :class:`UpdateRun` says what this one update trains. Layout under
``<paths.models>/<run.output or update-<letter>-<first month>_<last month>-seed<seed>>/``:

    checkpoints/checkpoint-N/   TRL/Trainer checkpoints (adapter, optimizer, scheduler, RNG): the resume points
    adapter/                    the final LoRA adapter + tokenizer (``PeftModel.from_pretrained(pi_init, adapter/)``)
    model/                      the LoRA-merged full model + tokenizer (when update.save_merged), what serving loads
    update.json                 what was trained on, the variant, the MLflow run id

Variant (A) performs no update: ``run_update`` returns pi_init unchanged (and says so).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abpo.months import Month

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateRun:
    """What one update trains: the inputs of a single call. They differ between calls that share one config (each
    month updates every LLM arm from its own champion on its own logs; an experiment trains every row of every
    round), so they are arguments of :func:`run_update`, never settings of section ``update``."""

    variant: str = "abpo"  # docs/ABPO_SPEC.md variant, letter or name (abpo.algo.variants.get_variant)
    arm: str = "abpo"  # only impressions this arm served enter the update (their e0 is its); "" = every arm's
    months: tuple[Month, ...] = ()  # the months whose impressions form D_bandit; () = every month ingested
    init_model: Path | None = None  # pi_init / the starting checkpoint; None = the output of `abpo sft`
    output: Path | None = None  # under paths.models unless absolute; None = update-<letter>-<months>-seed<seed>

    def __post_init__(self) -> None:
        # a bad month stops here, before a model is loaded, and the months are Month values from here on
        object.__setattr__(self, "months", tuple(Month(m, "update month") for m in self.months))


class UpdateInputMissing(RuntimeError):
    """An input of the update (pi_init, the bandit log in the warehouse) does not exist yet; the message names the
    command that makes it."""


@dataclass
class UpdateResult:
    variant: str
    output_dir: Path
    adapter_dir: Path | None
    model_dir: Path  # what to serve/evaluate next: the merged model (or pi_init for variant A)
    checkpoint_dir: Path | None  # the last checkpoint written (resume point)
    init_model_dir: Path
    mlflow_run_id: str | None
    global_step: int
    resumed_from: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's logged metrics
    batching: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)  # every step's logged metrics


def read_update_json(path: Path) -> UpdateResult:
    """The UpdateResult an update wrote to ``path`` (its update.json): what a launch of several processes returns
    to the process that started it (abpo.monthly.update.launch_refresh)."""
    raw = json.loads(Path(path).read_text())
    for k in ("output_dir", "adapter_dir", "model_dir", "checkpoint_dir", "init_model_dir"):
        raw[k] = Path(raw[k]) if raw.get(k) is not None else None
    known = {f.name for f in dataclasses.fields(UpdateResult)}
    return UpdateResult(**{k: v for k, v in raw.items() if k in known})


# ------------------------------------------------------------------------------------------- rollout signal

#: Per-step metrics whose mean over an update says whether its rollouts carried a learning signal.
SIGNAL_KEYS = {
    "format_reward": "rewards/format_reward/mean",
    "match_rate_positive": "abpo/match_rate/positive",
    "match_rate_no_response": "abpo/match_rate/no_response",
    "frac_reward_zero_std": "frac_reward_zero_std",
}


def rollout_signal(history: list[dict[str, float]]) -> dict[str, float]:
    """Means over the update's steps of the rollout-signal metrics (SIGNAL_KEYS; a metric absent at a step, e.g.
    the positive match rate of a batch without clicks, is averaged over the steps that have it)."""
    out = {}
    for name, key in SIGNAL_KEYS.items():
        vals = [h[key] for h in history if key in h and math.isfinite(h[key])]
        if vals:
            out[name] = sum(vals) / len(vals)
    return out


# ---------------------------------------------------------------------------------------------------- config


def output_dir_for(cfg, run: UpdateRun) -> Path:
    """``run.output`` under <paths.models> (as given when absolute), by default
    update-<letter>-<first month>_<last month>-seed<seed>."""
    from abpo.algo.variants import get_variant

    if run.output is not None:
        return cfg.paths.resolve("models") / run.output
    span = f"{run.months[0]}_{run.months[-1]}" if run.months else "all"
    return cfg.paths.resolve("models") / f"update-{get_variant(run.variant).letter}-{span}-seed{cfg.seed}"


def grpo_config(update_cfg, variant: str, *, output_dir: str | Path, seed: int, **overrides):
    """trl.GRPOConfig for `update_cfg` (the `update` section) and `variant`; see `grpo_kwargs`."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_kwargs(update_cfg, variant, output_dir=output_dir, seed=seed, **overrides))


def grpo_kwargs(update_cfg, variant: str, *, output_dir: str | Path, seed: int, **overrides) -> dict[str, Any]:
    """The GRPOConfig keyword arguments for `update_cfg` and `variant` (which sets the rollouts per example): the
    mapping of every knob, in one place (a plain dict, so the GPU preset's mapping can be checked on a machine
    without a GPU or DeepSpeed).

    Batch geometry: per_device_train_batch_size counts rollout rows = batch_size x rollouts_per_example; one
    optimizer step = one generation batch (steps_per_generation = grad_accum), the SNIPS mini-batch of step 3.
    """
    from abpo.algo.variants import get_variant
    from abpo.paths import repo_path
    from abpo.train.distributed import cuda_available, deepspeed_configured_state, env_world_size
    from abpo.train.trainer import rollouts_per_example

    u = update_cfg
    k = rollouts_per_example(get_variant(variant), u.group_size, equal_samples=u.grpo_equal_samples)
    deepspeed = None
    if u.deepspeed:
        ds = Path(u.deepspeed)
        deepspeed = str(repo_path(ds))
    # update.batch_size counts the logged examples of a micro-batch over all processes: each of the N processes of a
    # torchrun / accelerate launch trains batch_size / N of them (abpo.train.distributed.check_launch refuses a
    # batch the process count does not divide), so the update is the same whatever N
    world = env_world_size()
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        seed=seed,
        data_seed=seed,
        # groups: one logged example -> k rollouts; batch_size examples per device micro-batch
        num_generations=k,
        per_device_train_batch_size=max(u.batch_size // world, 1) * k,
        gradient_accumulation_steps=u.grad_accum,
        steps_per_generation=u.grad_accum,
        num_iterations=1,
        shuffle_dataset=False,  # the dataset's order is the stratified batch order
        # surrogate (step 5): ABPOTrainer._compute_loss computes it (abpo.algo.surrogate, update.ratio_level);
        # loss_type is checked there (only grpo: the per-rollout mean)
        epsilon=u.epsilon,
        beta=u.beta,
        loss_type=u.loss_type,
        # optimisation
        learning_rate=u.learning_rate,
        lr_scheduler_type=u.lr_scheduler_type,
        warmup_steps=u.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the total steps
        weight_decay=u.weight_decay,
        max_grad_norm=u.max_grad_norm,
        optim=u.optim,
        num_train_epochs=u.epochs,
        max_steps=u.max_steps,
        # rollouts
        temperature=u.temperature,
        top_p=u.top_p,
        max_completion_length=u.max_completion_length,
        use_vllm=u.use_vllm,
        vllm_mode=u.vllm_mode,
        vllm_gpu_memory_utilization=u.vllm_gpu_memory_utilization,
        vllm_importance_sampling_correction=u.vllm_importance_sampling_correction,
        # hardware (GRPOConfig defaults bf16=True and gradient_checkpointing=True: set both explicitly)
        bf16=u.bf16,
        fp16=False,
        gradient_checkpointing=u.gradient_checkpointing,
        deepspeed=deepspeed,
        # the CPU said explicitly (a CPU launch of N processes is then data-parallel over gloo, not N processes
        # training alone); DeepSpeed on the CPU brings its own CPU accelerator, which use_cpu would drop
        use_cpu=not cuda_available() and deepspeed is None,
        # DeepSpeed over several CPU processes: the state abpo.train.distributed.dist_state built (it counts the
        # process group; the one transformers would rebuild counts one process)
        **({"accelerator_config": {"use_configured_state": True}} if deepspeed_configured_state(deepspeed) else {}),
        disable_dropout=True,
        # update.greedy_rollouts: the most likely answer instead of a sample (ABPOTrainer reads it for the
        # constrained single-choice path too)
        **({"generation_kwargs": {"do_sample": False}} if u.greedy_rollouts else {}),
        # checkpoints and logging (metrics go to MLflow through MLflowStepCallback)
        save_strategy="steps",
        save_steps=u.save_steps,
        save_total_limit=u.save_total_limit or None,
        logging_steps=u.logging_steps,
        report_to="none",
        log_completions=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    kwargs.update(overrides)
    return kwargs


def settings_for(cfg, variant: str):
    """ABPOTrainer's settings of `variant` from the config (section update and the policy's scoring settings)."""
    from abpo.train.trainer import ABPOSettings

    u = cfg.update
    return ABPOSettings(
        variant=variant, delta=u.delta, eps_std=u.eps_std, lambda_sc=u.lambda_sc, tau=cfg.policy.tau,
        w_max=u.w_max, scoring_batch_tokens=cfg.policy.scoring_batch_tokens,
        constrained_rollouts=cfg.policy.constrained_rollouts, ratio_level=u.ratio_level,
        grpo_equal_samples=u.grpo_equal_samples, prompt_style=cfg.policy.prompt_style,
        self_certainty_positions=u.self_certainty_positions,
    )


# ------------------------------------------------------------------------------------------------------ inputs


def init_dir_for(cfg, run: UpdateRun) -> Path:
    """pi_init: ``run.init_model`` (a relative path that does not exist here is taken from the repository root, or
    installed from the current directory then the bundled resources: `abpo.paths.repo_path`), else the directory
    `abpo sft` writes for this config."""
    if run.init_model is None:
        return cfg.paths.resolve("models") / cfg.sft.output
    p = run.init_model
    if not p.is_absolute() and not p.exists():
        from abpo.paths import repo_path

        p = repo_path(p)
    return p


def load_start_model(init_dir: Path, cfg):
    """(model, tokenizer) of pi_init; a PEFT adapter directory is merged into its base first (the update trains a
    fresh LoRA on top of pi_init)."""
    from abpo.policy.model import load_policy

    if not (init_dir / "config.json").exists() and not (init_dir / "adapter_config.json").exists():
        raise UpdateInputMissing(
            f"{init_dir}: pi_init not found (no config.json / adapter_config.json); run `abpo sft "
            f"--config {cfg.name}` first, or pass the model directory (`abpo update --init-model DIR`)"
        )
    policy = dataclasses.replace(cfg.policy, model=str(init_dir))
    model, tokenizer = load_policy(policy, cfg.paths, seed=cfg.seed)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.train()
    return model, tokenizer


@dataclass(frozen=True)
class HeldOut:
    """The rows of an update's months that D_bandit leaves out because their user is in the gate's held-out slice
    (config ``arms.gate_users = warehouse``, abpo.data.holdout)."""

    users: int  # held-out users with impressions of the arm in the months (of any arm when the arm is "")
    positive: int  # the arm's clicked rows of those users
    no_response: int  # the arm's no-response rows of those users

    @property
    def rows(self) -> int:
        return self.positive + self.no_response


def read_update_strata(cfg, wh, months: list[str], arm: str):
    """(positive, no_response, held_out) of arm ``arm`` (every arm's when "") in ``months``, read from the open
    warehouse ``wh``: the strata of D_bandit. With ``arms.gate_users = warehouse`` the rows of the gate's held-out
    users (the slice of ``arms.gate_holdout_fraction`` among the months' users, abpo.data.holdout) are left out by an
    anti-join in DuckDB, and counted and logged in ``held_out`` (None with ``dataset``: nothing is left out), so the
    users the gate scores are users no update trained on."""
    import pyarrow.compute as pc

    from abpo.data.holdout import check_gate_users, gate_holdout_users

    held = None
    if check_gate_users(cfg.arms.gate_users) == "dataset":
        positive, no_response = wh.strata(months)
    else:
        excluded = gate_holdout_users(wh.impression_users(months), seed=cfg.seed, gate_users=cfg.arms.gate_users,
                                      fraction=cfg.arms.gate_holdout_fraction)
        positive, no_response = wh.strata(months, exclude_users=excluded)
        counts = [r for r in wh.held_out_rows(months, excluded) if not arm or r["arm"] == arm]
        held = HeldOut(len(excluded) if not arm else sum(r["users"] for r in counts),
                       sum(r["positive"] for r in counts), sum(r["no_response"] for r in counts))
        log.info(f"update {arm or 'every arm'}, months {months}: held out {held.positive} positive + "
                 f"{held.no_response} no-response rows of the gate's users ({held.users} users, "
                 f"arms.gate_holdout_fraction={cfg.arms.gate_holdout_fraction}, arms.gate_users=warehouse)")
    if arm:
        positive = positive.filter(pc.equal(positive.column("arm"), arm))
        no_response = no_response.filter(pc.equal(no_response.column("arm"), arm))
    return positive, no_response, held


UPDATE_LOGS = ("own", "all")  # config arms.update_logs


class UntrustedLogRows(ValueError):
    """Logged rows of an update's D_bandit whose propensity e0 cannot be trusted (or whose arm is not served):
    refused, never used; the message names arm, month, impression and rule of the first ones."""


def check_update_logs(value: str) -> str:
    """``value`` when it is one of UPDATE_LOGS (config arms.update_logs), else ValueError naming the key and rule."""
    if value not in UPDATE_LOGS:
        raise ValueError(f"arms.update_logs={value!r}; rule: one of {list(UPDATE_LOGS)}")
    return value


def _untrusted(arm: Any, p: Any, arms: set[str], min_propensity: float) -> str | None:
    """The rule a logged row breaks, or None: its arm is served (``arms``) and its e0 is a probability we can divide
    by (finite, in [min_propensity, 1], min_propensity > 0): the SNIPS weight w = e_old/e0 of docs/ABPO_SPEC.md
    step 3 is then finite and means what it says."""
    if arm not in arms:
        return f"arm not in arms.names {sorted(arms)}"
    if p is None:
        return "propensity missing"
    p = float(p)
    if not math.isfinite(p):
        return "propensity not finite"
    if p <= 0.0:
        return "propensity <= 0"
    if p > 1.0:
        return "propensity > 1"
    if p < min_propensity:
        return f"propensity below data.min_propensity={min_propensity}"
    return None


def refuse_untrusted_rows(tables, *, arms, min_propensity: float, updating: str, show: int = 5) -> None:
    """Raise UntrustedLogRows when any row of ``tables`` (the strata, IMPRESSIONS_SCHEMA columns month,
    impression_id, arm, propensity) breaks a rule of :func:`_untrusted`; the message names the first ``show`` rows
    (arm, month, impression, e0, rule) and how many there are. Ingest quarantines most such rows already
    (sql/ingest_check.sql); this is the update's own check, so a warehouse written another way cannot slip a
    row with a meaningless weight into D_bandit."""
    served = set(arms)
    bad = []
    for t in tables:
        cols = t.select(["month", "impression_id", "arm", "propensity"]).to_pydict()
        for m, i, a, p in zip(cols["month"], cols["impression_id"], cols["arm"], cols["propensity"], strict=True):
            rule = _untrusted(a, p, served, float(min_propensity))
            if rule is not None:
                bad.append(f"arm {a}, month {m}, impression {i}: e0 {p}; rule: {rule}")
    if bad:
        raise UntrustedLogRows(
            f"update of arm {updating}: {len(bad)} logged row(s) refused, none used: " + "; ".join(bad[:show])
            + (f"; ... and {len(bad) - show} more" if len(bad) > show else ""))


def logged_by(tables) -> dict[str, float]:
    """The share of the rows of ``tables`` logged by each arm (column ``arm``), by arm name; {} for no rows."""
    from collections import Counter

    counts: Counter[str] = Counter()
    for t in tables:
        counts.update(t.column("arm").to_pylist())
    total = sum(counts.values())
    return {a: counts[a] / total for a in sorted(counts)} if total else {}


def warehouse_strata(cfg, run: UpdateRun):
    """(positive, no_response, months) of ``run.arm`` in ``run.months`` (every ingested month when empty), without
    the gate's held-out users (:func:`read_update_strata`)."""
    from abpo.warehouse import Warehouse

    path = cfg.paths.resolve("warehouse")
    if not path.exists():
        raise UpdateInputMissing(
            f"{path}: no warehouse yet; build and ingest the bandit log first: `abpo simulate-log --config "
            f"{cfg.name}` then `abpo ingest --month YYYY-MM --config {cfg.name}`"
        )
    with Warehouse(path, read_only=True) as wh:  # a reader: never holds the write lock
        months = list(run.months) or wh.months()
        if not months:
            raise UpdateInputMissing(
                f"{path}: no impressions ingested; build and ingest the bandit log first: `abpo simulate-log "
                f"--config {cfg.name}` then `abpo ingest --month YYYY-MM --config {cfg.name}`"
            )
        positive, no_response, _ = read_update_strata(cfg, wh, months, run.arm)
    arm = run.arm
    if positive.num_rows + no_response.num_rows == 0:
        raise UpdateInputMissing(
            f"{path}: no impressions of arm {arm!r} in months {months}; build and ingest the bandit log first "
            f"(`abpo simulate-log --arm {arm}`, `abpo ingest`), or choose others (`abpo update --arm --month`)"
        )
    return positive, no_response, months


# ------------------------------------------------------------------------------------------------------- train


def _last_checkpoint(ckpt_dir: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None


def make_trainer(
    model,
    tokenizer,
    train_dataset,
    update_cfg,
    settings,
    *,
    output_dir: Path,
    seed: int,
    peft_config=None,
    callbacks: list | None = None,
    grpo_overrides: dict | None = None,
    quiet: bool = False,
    item_popularity: dict[int, int] | None = None,
):
    """ABPOTrainer for ``settings.variant`` writing checkpoints under `output_dir/checkpoints`, checked against the
    launch (abpo.train.distributed.check_trainer: a process group needs a distributed trainer, a DeepSpeed config
    must not be dropped) before anything trains or an MLflow run opens. `quiet` drops the console
    progress/printer callbacks (metrics still reach `trainer.state.log_history` and MLflow). ``item_popularity``
    (item -> training interaction count) feeds the diagnostic abpo/r_sc_corr_popularity (docs/diagnostics.md)."""
    from abpo.train.distributed import check_trainer
    from abpo.train.trainer import ABPOTrainer, MLflowStepCallback

    ckpt_dir = Path(output_dir) / "checkpoints"
    args = grpo_config(update_cfg, settings.variant, output_dir=ckpt_dir, seed=seed, **(grpo_overrides or {}))
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=settings,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[MLflowStepCallback(), *(callbacks or [])],
        item_popularity=item_popularity,
    )
    check_trainer(trainer, update_cfg)
    if quiet:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    return trainer


def resume_point(output_dir: Path, resume: bool | str) -> str | None:
    """The checkpoint a training resumes from: ``resume`` itself when a path, the last one under
    `output_dir/checkpoints` when True, else None."""
    if isinstance(resume, str):
        return resume
    return _last_checkpoint(Path(output_dir) / "checkpoints") if resume else None


def train_update(
    model,
    tokenizer,
    train_dataset,
    update_cfg,
    settings,
    *,
    output_dir: Path,
    seed: int,
    peft_config=None,
    resume: bool | str = True,
    callbacks: list | None = None,
    grpo_overrides: dict | None = None,
    quiet: bool = False,
    item_popularity: dict[int, int] | None = None,
):
    """Build ABPOTrainer (:func:`make_trainer`) and train (resuming from the last checkpoint in
    `output_dir/checkpoints` when `resume`). Returns (trainer, resumed_from). Logging to MLflow happens when a run
    is active."""
    trainer = make_trainer(
        model, tokenizer, train_dataset, update_cfg, settings, output_dir=output_dir, seed=seed,
        peft_config=peft_config, callbacks=callbacks, grpo_overrides=grpo_overrides, quiet=quiet,
        item_popularity=item_popularity,
    )
    resumed_from = resume_point(output_dir, resume)
    trainer.train(resume_from_checkpoint=resumed_from)
    return trainer, resumed_from


def save_update(trainer, tokenizer, output_dir: Path, *, save_merged: bool) -> tuple[Path, Path | None]:
    """adapter/ (LoRA or full weights) and, if asked, model/ (merged); both with the tokenizer. Called by every
    process of a multi-process update: ``trainer.save_model`` is collective (DeepSpeed gathers there) and writes on
    the main process; the tokenizer and the merged model are written by rank 0 alone, the others wait."""
    from abpo.train.distributed import barrier

    main = trainer.accelerator.is_main_process
    adapter_dir = Path(output_dir) / "adapter"
    if main and adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    barrier()
    trainer.save_model(str(adapter_dir))
    if main:
        tokenizer.save_pretrained(adapter_dir)
    merged_dir = None
    if save_merged:
        from abpo.policy.model import save_policy

        merged_dir = Path(output_dir) / "model"
    if merged_dir is not None and main:
        if merged_dir.exists():
            shutil.rmtree(merged_dir)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "merge_and_unload"):
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        save_policy(model, tokenizer, merged_dir)
    barrier()
    return adapter_dir, merged_dir


def run_update(
    cfg, run: UpdateRun, *, progress: bool = True, strata=None, log_mlflow: bool = True, nested: bool = False,
    callbacks=None, run_tags: dict[str, str] | None = None,
) -> UpdateResult:
    """The `abpo update` job: pi_init + D_bandit (warehouse) -> the variant's update, logged to MLflow; ``cfg`` says
    how to train, ``run`` what (:class:`UpdateRun`).

    ``strata``: (positive, no_response) tables in IMPRESSIONS_SCHEMA, the logs of ``run.months``, to train on
    instead of the warehouse's (the arm loop passes an arm's own rows it has already read and checked; the
    experiment runner the log it built in memory). ``log_mlflow=False`` runs without an
    MLflow run (the metrics stay in ``result.metrics`` / ``result.history``); ``nested`` opens the run inside the
    active one. ``callbacks``: extra transformers TrainerCallbacks (progress reporting). ``run_tags``: extra tags of
    the update's MLflow run (the production loop's task key)."""
    from abpo import registry
    from abpo.algo.variants import get_variant
    from abpo.data.loaders import load_dataset
    from abpo.policy.model import lora_config

    if strata is not None and not run.months:
        raise ValueError("run_update: strata without run.months; rule: name the months whose logs the tables hold")
    variant = get_variant(run.variant)
    init_dir = init_dir_for(cfg, run)
    if not variant.update:
        out = output_dir_for(cfg, run)
        if not init_dir.exists():
            raise UpdateInputMissing(f"{init_dir}: pi_init not found; run `abpo sft --config {cfg.name}` first")
        if not log_mlflow:
            return UpdateResult(variant.name, out, None, init_dir, None, init_dir, None, 0)
        with registry.start_run(cfg, cfg.update.mlflow_experiment, f"update-{variant.letter}", nested=nested,
                                tags={"abpo.variant": variant.name, "abpo.init_model": str(init_dir)}) as mlrun:
            import mlflow

            mlflow.log_param("update.variant", variant.name)
        return UpdateResult(variant.name, out, None, init_dir, None, init_dir, mlrun.info.run_id, 0)

    from abpo.train.distributed import barrier, broadcast_from_main, check_launch, dist_state

    check_launch(cfg.update)  # a launch that would train wrongly stops here, before a model loads
    dist = dist_state(deepspeed=bool(cfg.update.deepspeed))
    model, tokenizer = load_start_model(init_dir, cfg)
    if strata is not None:
        positive, no_response = strata
    else:
        positive, no_response, months = warehouse_strata(cfg, run)
        run = dataclasses.replace(run, months=tuple(months))
    from abpo.train.dataset import subsample_strata, update_dataset_from_strata

    dataset = load_dataset(cfg.data)
    # one optimizer step over all processes (update.batch_size counts the examples of every process's micro-batch)
    examples_per_batch = cfg.update.batch_size * cfg.update.grad_accum
    positive, no_response, note = subsample_strata(positive, no_response, cfg.update.max_examples, cfg.seed)
    train_ds, report = update_dataset_from_strata(
        positive, no_response, dataset.titles(), tokenizer, cfg.policy,
        examples_per_batch=examples_per_batch, seed=cfg.seed, stratification=cfg.update.stratification,
    )
    if note:
        report.notes.insert(0, note)
    out = output_dir_for(cfg, run)
    resume = cfg.update.resume
    finished = (out / "update.json").exists()
    barrier()  # every process has looked before rank 0 removes anything
    if finished:
        # a finished update of the same inputs: a rerun retrains from scratch (same seed -> same result) instead
        # of "resuming" a completed run; only an interrupted update (checkpoints, no update.json) resumes
        if dist.is_main:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            (out / "update.json").unlink()
        resume = False
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    barrier()
    # built before the MLflow run opens: the trainer's refusals (a process group without a distributed trainer, a
    # dropped DeepSpeed config, settings it rejects) leave no FAILED run behind
    trainer = make_trainer(
        model, tokenizer, train_ds, cfg.update, settings_for(cfg, variant.name), output_dir=out, seed=cfg.seed,
        peft_config=lora_config(cfg.policy), callbacks=callbacks, grpo_overrides={"disable_tqdm": not progress},
        item_popularity=dataset.popularity(),
    )
    resumed_from = resume_point(out, resume)
    tags = {
        "abpo.variant": variant.name,
        "abpo.variant_letter": variant.letter,
        "abpo.arm": run.arm,
        "abpo.months": ",".join(run.months),
        "abpo.init_model": str(init_dir),
        "abpo.output_dir": str(out),
        **(run_tags or {}),
    }
    import contextlib

    # rank 0 alone opens the run (and logs params, tags and the metrics of MLflowStepCallback)
    run_ctx = (
        registry.start_run(cfg, cfg.update.mlflow_experiment, f"update-{variant.letter}-{'_'.join(run.months)}",
                           tags=tags, nested=nested)
        if log_mlflow and dist.is_main else contextlib.nullcontext()
    )
    with run_ctx as mlrun:
        params = {f"update.{k}": v for k, v in dataclasses.asdict(cfg.update).items()}
        # what was trained, under the names these inputs had as settings (runs stay comparable in MLflow); the
        # starting model and the output directory are the tags abpo.init_model and abpo.output_dir
        params.update({"update.variant": variant.name, "update.arm": run.arm, "update.months": list(run.months)})
        params.update({"policy.tau": cfg.policy.tau, "policy.lora_r": cfg.policy.lora_r, "seed": cfg.seed,
                       "policy.constrained_rollouts": cfg.policy.constrained_rollouts})
        params.update(report.as_params())
        if mlrun is not None:
            import mlflow

            mlflow.log_params({k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in params.items()})
        trainer.train(resume_from_checkpoint=resumed_from)
        adapter_dir, merged_dir = save_update(trainer, tokenizer, out, save_merged=cfg.update.save_merged)
        if mlrun is not None:
            import mlflow

            if resumed_from:
                mlflow.set_tag("abpo.resumed_from", resumed_from)
            mlflow.set_tags({"abpo.adapter_dir": str(adapter_dir), "abpo.model_dir": str(merged_dir or adapter_dir)})
        ckpt = _last_checkpoint(out / "checkpoints")
        steps = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]  # per-step logs, not the summary
        final = {k: float(v) for k, v in (steps[-1] if steps else {}).items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        result = UpdateResult(
            variant=variant.name, output_dir=out, adapter_dir=adapter_dir, model_dir=merged_dir or adapter_dir,
            checkpoint_dir=Path(ckpt) if ckpt else None, init_model_dir=init_dir,
            mlflow_run_id=broadcast_from_main(mlrun.info.run_id if mlrun is not None else None),
            global_step=trainer.state.global_step, resumed_from=resumed_from, metrics=final,
            batching=report.as_params(), history=[
                {k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                for h in steps
            ],
        )
        if mlrun is not None and result.history:
            import mlflow

            mlflow.log_metrics({f"summary/{k}": v for k, v in rollout_signal(result.history).items()})
    if dist.is_main:
        (out / "update.json").write_text(json.dumps(
            {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(result).items()}, indent=1,
            default=str,
        ))
    barrier()  # update.json is there when any process returns
    return result
