"""Config section `update`: the ABPO update (every knob of ABPO_SPEC.md's update step)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class UpdateConfig:
    variant: str = field(
        default="abpo",
        metadata={"help": "A none | B grpo | C anchor | D anchor_snips | E anchor_sc | F abpo (ABPO_SPEC.md variants)."},
    )
    group_size: int = field(default=4, metadata={"help": "G: the anchor plus G-1 sampled rollouts (paper: 16)."})
    delta: float = field(default=1e-6, metadata={"help": "delta in w_hat = w / (mean_{B_y} w + delta)."})
    eps_std: float = field(default=1e-4, metadata={"help": "eps_std inside the anchored spread sigma_i."})
    lambda_sc: float = field(default=0.1, metadata={"help": "lambda_sc: weight of self-certainty for no-response rows."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the surrogate ratio."})
    beta: float = field(default=0.0, metadata={"help": "KL regulariser weight (0 = off, as optional in the spec)."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Update learning rate (paper: 5e-5)."})
    batch_size: int = field(default=4, metadata={"help": "Logged examples per update mini-batch (paper: 4)."})
    grad_accum: int = field(default=1, metadata={"help": "Gradient accumulation (paper: 8)."})
    epochs: float = field(default=1.0, metadata={"help": "Passes over D_bandit (paper: 1)."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many steps; -1 = epochs decide."})
    warmup_ratio: float = field(default=0.05, metadata={"help": "Warm-up ratio (paper: 0.05)."})
    weight_decay: float = field(default=0.01, metadata={"help": "Weight decay (paper: 0.01)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping (paper: 1.0)."})
    temperature: float = field(default=1.0, metadata={"help": "Rollout sampling temperature."})
    max_completion_length: int = field(default=48, metadata={"help": "Max new tokens per rollout."})
    save_steps: int = field(default=20, metadata={"help": "Checkpoint every this many steps (resume point)."})
    bf16: bool = field(default=False, metadata={"help": "bf16 training (GPU preset)."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Gradient checkpointing (GPU preset)."})
    deepspeed: str = field(default="", metadata={"help": "DeepSpeed config file (GPU preset: configs/deepspeed_zero2.json)."})
    use_vllm: bool = field(default=False, metadata={"help": "vLLM colocate rollouts (GPU only)."})
    optim: str = field(default="adamw_torch", metadata={"help": "Optimizer (paper: paged_adamw_8bit)."})
