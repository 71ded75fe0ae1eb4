"""The mapping of the config (section ``update`` and the policy's scoring settings) onto the trainer's arguments:
trl.GRPOConfig (`grpo_config` / `grpo_kwargs`), `ABPOSettings` (`settings_for`) and the update's directory
(`output_dir_for`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.algo.variants import get_variant
from abpo.config.update import UpdateConfig
from abpo.paths import repo_path
from abpo.train.records import ABPOSettings, rollouts_per_example
from abpo.train.runs import UpdateRun

if TYPE_CHECKING:
    from abpo.config import Config


def output_dir_for(cfg: Config, run: UpdateRun) -> Path:
    """``run.output`` under <paths.models> (as given when absolute), by default
    update-<letter>-<first month>_<last month>-seed<seed>."""

    if run.output is not None:
        return cfg.paths.resolve("models") / run.output
    span = f"{run.months[0]}_{run.months[-1]}" if run.months else "all"
    return cfg.paths.resolve("models") / f"update-{get_variant(run.variant).letter}-{span}-seed{cfg.seed}"


def grpo_config(update_cfg: UpdateConfig, variant: str, *, output_dir: str | Path, seed: int, **overrides):
    """trl.GRPOConfig for `update_cfg` (the `update` section) and `variant`; see `grpo_kwargs`."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_kwargs(update_cfg, variant, output_dir=output_dir, seed=seed, **overrides))


def grpo_kwargs(
    update_cfg: UpdateConfig, variant: str, *, output_dir: str | Path, seed: int, **overrides
) -> dict[str, Any]:
    """The GRPOConfig keyword arguments for `update_cfg` and `variant` (which sets the rollouts per example): the
    mapping of every knob, in one place (a plain dict, so the GPU preset's mapping can be checked on a machine
    without a GPU or DeepSpeed).

    Batch geometry: per_device_train_batch_size counts rollout rows = batch_size x rollouts_per_example; one
    optimizer step = one generation batch (steps_per_generation = grad_accum), the SNIPS mini-batch of step 3.
    """
    from abpo.train.distributed import env_world_size

    u = update_cfg
    k = rollouts_per_example(get_variant(variant), u.group_size, equal_samples=u.grpo_equal_samples)
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
        **hardware_kwargs(u),
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


def hardware_kwargs(u: UpdateConfig) -> dict[str, Any]:
    """The GRPOConfig keyword arguments of the hardware: precision, gradient checkpointing, DeepSpeed (its config
    file found from the repository root) and the CPU."""
    from abpo.train.distributed import cuda_available, deepspeed_configured_state

    deepspeed = str(repo_path(Path(u.deepspeed))) if u.deepspeed else None
    return dict(
        # GRPOConfig defaults bf16=True and gradient checkpointing on: set both explicitly, the latter by transformers
        # 5's name (gradient_checkpointing, its deprecated alias, printed a FutureWarning)
        bf16=u.bf16,
        fp16=False,
        activation_checkpointing=u.gradient_checkpointing,
        deepspeed=deepspeed,
        # the CPU said explicitly (a CPU launch of N processes is then data-parallel over gloo, not N processes
        # training alone); DeepSpeed on the CPU brings its own CPU accelerator, which use_cpu would drop
        use_cpu=not cuda_available() and deepspeed is None,
        # DeepSpeed over several CPU processes: the state abpo.train.distributed.dist_state built (it counts the
        # process group; the one transformers would rebuild counts one process)
        **({"accelerator_config": {"use_configured_state": True}} if deepspeed_configured_state(deepspeed) else {}),
    )


def variant_update_config(update_cfg: UpdateConfig, variant: str) -> UpdateConfig:
    """Section update with the settings `variant` fixes (``Variant.presets``, docs/update-variants.md) applied: a
    preset key left at its default takes the variant's value. A key the config set to another value is refused
    (a ValueError naming the key, both values and the rule): a row named grpo_cr must not train with some other
    no-response weight. Variants A-F fix nothing (the section is returned as it is)."""
    import dataclasses

    v = get_variant(variant)
    if not v.presets:
        return update_cfg
    defaults = UpdateConfig()
    changes = {}
    for key, value in v.presets:
        current, default = getattr(update_cfg, key), getattr(defaults, key)
        if current == value:
            continue
        if current != default:
            raise ValueError(
                f"update.{key}={current!r}: variant {v.letter} ({v.name}) fixes update.{key}={value!r}; rule: leave "
                f"update.{key} at its default {default!r} with this variant, or set it on a variant that does not fix "
                "it (docs/update-variants.md)"
            )
        changes[key] = value
    return dataclasses.replace(update_cfg, **changes)


def settings_for(cfg: Config, variant: str, *, click_rate: float | None = None) -> ABPOSettings:
    """ABPOTrainer's settings of `variant` from the config (section update with the variant's presets applied,
    `variant_update_config`, and the policy's scoring settings). ``click_rate``: c of the logged rows the update
    trains on, for update.no_response_weight_rule=click_rate (docs/update-variants.md Eq. N2)."""
    return ABPOSettings.from_config(
        variant_update_config(cfg.update, variant), cfg.policy, variant, click_rate=click_rate
    )
