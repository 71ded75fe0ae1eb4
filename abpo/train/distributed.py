"""The processes of one update: how many, which one this is, and the launches that would train wrongly.

An update runs as one process (``abpo update``) or data-parallel as N processes under ``torchrun --nproc_per_node N``
or ``accelerate launch`` (CPU: gloo; GPU: nccl; DeepSpeed ZeRO through ``update.deepspeed``). Every process reads
the same D_bandit and trains its slice of each optimizer step's batch; rank 0 alone opens the MLflow run and writes
what the update leaves behind (docs/distributed.md).

:func:`dist_state` is the one place the process count and rank come from: accelerate's ``PartialState``, made
CPU-aware (``cpu=True`` on a machine without CUDA, so a CPU launch is ``MULTI_CPU`` over gloo instead of N processes
that each train the whole update alone). :func:`check_launch` refuses, in one line and before any model is loaded
or MLflow run opened, the launches that would otherwise exit 0 having trained the wrong thing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError
from abpo.paths import repo_path

if TYPE_CHECKING:
    from abpo.config.update import UpdateConfig


class LaunchRefused(ExpectedError, RuntimeError):
    """A multi-process launch that would train wrongly; the message names the setting and the rule."""


@dataclass(frozen=True)
class DistState:
    world_size: int  # processes of the update
    rank: int  # this process's index, 0 = the one that logs and writes
    cpu: bool  # no CUDA: gloo (or DeepSpeed's CPU accelerator) instead of nccl

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def env_world_size(env: Mapping[str, str] | None = None) -> int:
    """The process count a launcher announced (torchrun / accelerate: WORLD_SIZE; MPI: PMI_SIZE,
    OMPI_COMM_WORLD_SIZE, MV2_COMM_WORLD_SIZE); 1 when launched as a plain process."""
    env = os.environ if env is None else env
    for key in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if env.get(key):
            return int(env[key])
    return 1


def zero_stage(deepspeed: str) -> int:
    """``zero_optimization.stage`` of the DeepSpeed config file ``deepspeed`` (a path; relative to the repository
    when not found as given, as transformers is handed it by abpo.train.grpo_args.grpo_kwargs); 0 when absent."""
    import json
    from pathlib import Path

    path = repo_path(Path(deepspeed))
    try:
        conf = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LaunchRefused(
            f"update.deepspeed={deepspeed}: cannot read {path} as JSON ({e}); rule: a DeepSpeed "
            "config file (configs/deepspeed_zero2.json)"
        ) from e
    return int((conf.get("zero_optimization") or {}).get("stage", 0))


def deepspeed_cpu_backend() -> str:
    """The collective backend of DeepSpeed's CPU accelerator: ccl with oneCCL's torch bindings, gloo without."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().communication_backend_name()


def deepspeed_configured_state(deepspeed: str | None) -> bool:
    """Whether the trainer must reuse the state :func:`dist_state` built (a DeepSpeed launch of several processes
    without CUDA: the state transformers would rebuild counts one process)."""
    return bool(deepspeed) and env_world_size() > 1 and not cuda_available()


def dist_state(*, deepspeed: bool = False) -> DistState:
    """Process count and rank of this update from accelerate's PartialState, CPU-aware (cpu=True without CUDA)
    unless DeepSpeed initialises the process group itself (``deepspeed``). A plain process: (1, 0)."""
    cpu = not cuda_available()
    if env_world_size() <= 1:
        return DistState(1, 0, cpu)
    from accelerate import PartialState

    if deepspeed:
        # What transformers sets while building its state. Without CUDA, accelerate finds no backend of its own
        # (None): DeepSpeed then initialises the process group (its CPU accelerator) but accelerate counts ONE
        # process, so every rank would train the whole update. Naming DeepSpeed's CPU backend (gloo, or ccl where
        # oneCCL is installed) makes accelerate count the group; the trainer reuses this state
        # (grpo_kwargs: accelerator_config use_configured_state) instead of rebuilding the miscounted one.
        kwargs = {"backend": deepspeed_cpu_backend()} if cpu else {}
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        try:
            state = PartialState(**kwargs)
        finally:
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
    else:
        state = PartialState(cpu=cpu)
    return DistState(int(state.num_processes), int(state.process_index), cpu)


def check_launch(update_cfg: UpdateConfig, env: Mapping[str, str] | None = None) -> None:
    """LaunchRefused when this launch would train wrongly (each a one-line message, raised before any model is
    loaded or MLflow run opened):

    - ``accelerate launch --cpu --num_processes N`` (N > 1) without MPI starts ONE process (accelerate spreads CPU
      processes only through mpirun): recognised by ACCELERATE_USE_CPU with MASTER_ADDR set and no process count;
    - ``update.deepspeed`` set while the CPU is forced through ACCELERATE_USE_CPU (transformers then builds a plain
      CPU state and drops DeepSpeed without a word);
    - ``update.deepspeed`` a ZeRO stage-3 config over several processes (parameters partitioned: the rollouts and e_old scoring do not
      run the same forwards on every rank, and the launch aborts on a collective mismatch mid-step);
    - ``update.batch_size`` (logged examples per micro-batch over all processes) not divisible by the process count.
    """
    env = os.environ if env is None else env
    world = env_world_size(env)
    forced_cpu = str(env.get("ACCELERATE_USE_CPU", "")).lower() in ("1", "true", "yes")
    if forced_cpu and world <= 1 and env.get("MASTER_ADDR"):
        raise LaunchRefused(
            "abpo update: `accelerate launch --cpu --num_processes N` starts one process without MPI (ACCELERATE_USE_CPU "
            "and MASTER_ADDR set, no WORLD_SIZE); rule: launch CPU processes with `torchrun --nproc_per_node N "
            "-m abpo.cli update ...` (or accelerate with an mpirun hostfile)"
        )
    if update_cfg.deepspeed and forced_cpu:
        raise LaunchRefused(
            f"update.deepspeed={update_cfg.deepspeed}: ACCELERATE_USE_CPU is set, so transformers would build a plain CPU "
            "state and drop DeepSpeed; rule: launch DeepSpeed without --cpu (torchrun; DeepSpeed picks its CPU "
            "accelerator on a machine without CUDA)"
        )
    if world > 1 and update_cfg.deepspeed and zero_stage(update_cfg.deepspeed) >= 3:
        raise LaunchRefused(
            f"update.deepspeed={update_cfg.deepspeed}: zero_optimization.stage={zero_stage(update_cfg.deepspeed)} "
            "partitions the parameters, so every rank must run the same forwards in the same order, and the "
            "rollouts and e_old scoring do not (a collective mismatch aborts the launch mid-step); rule: ZeRO stage 2 "
            "or below (configs/deepspeed_zero2.json)"
        )
    if update_cfg.batch_size % world:
        raise LaunchRefused(
            f"update.batch_size={update_cfg.batch_size} with {world} processes; rule: the batch (logged examples per "
            "micro-batch over all processes) must be divisible by the process count"
        )


def check_trainer(trainer, update_cfg: UpdateConfig) -> None:
    """LaunchRefused when the built trainer would not train as the launch asked (before training and before the
    MLflow run opens): a process group of several processes but a trainer that is not data-parallel (each process
    would train the whole update alone), or ``update.deepspeed`` set but DeepSpeed not enabled (dropped)."""
    from transformers.training_args import ParallelMode

    world = env_world_size()
    args = trainer.args
    if world > 1 and (args.parallel_mode != ParallelMode.DISTRIBUTED or trainer.accelerator.num_processes != world):
        raise LaunchRefused(
            f"abpo update: {world} processes launched (WORLD_SIZE) but the trainer runs {args.parallel_mode.value} with "
            f"{trainer.accelerator.num_processes} process(es); rule: a process group needs a distributed trainer "
            "(each process would train the whole update alone)"
        )
    if update_cfg.deepspeed and not getattr(trainer, "is_deepspeed_enabled", False):
        raise LaunchRefused(
            f"update.deepspeed={update_cfg.deepspeed}: the trainer was built without DeepSpeed (it would be dropped); "
            "rule: launch without --cpu / use_cpu and with deepspeed installed (pip install 'abpo[distributed]')"
        )


def barrier() -> None:
    """Wait for every process (nothing when there is one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_from_main(value: Any) -> Any:
    """rank 0's ``value`` on every process (itself when there is one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
