"""Config sections `policy` (the LLM recommender) and `sft` (training pi_init on D_sup)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PolicyConfig:
    model: str = field(
        default="tiny",
        metadata={"help": "tiny | smollm2-135m | a local Hugging Face model directory or id (loaded offline)."},
    )
    max_history: int = field(default=10, metadata={"help": "Most recent history items shown in the prompt."})
    max_prompt_tokens: int = field(
        default=1024, metadata={"help": "Prompt token budget; over it the oldest history items are dropped first."}
    )
    tau: float = field(default=1.0, metadata={"help": "Temperature of e_p(a|q) = softmax(s_p(a,q)/tau) over C."})
    scoring_batch_tokens: int = field(
        default=16384, metadata={"help": "Memory bound for candidate scoring: tokens per forward pass."}
    )
    # tiny model shape (used when model == tiny)
    tiny_hidden_size: int = field(default=128, metadata={"help": "tiny: hidden size."})
    tiny_layers: int = field(default=2, metadata={"help": "tiny: decoder layers."})
    tiny_heads: int = field(default=4, metadata={"help": "tiny: attention heads."})
    tiny_intermediate_size: int = field(default=256, metadata={"help": "tiny: MLP width."})
    tiny_vocab_size: int = field(default=4096, metadata={"help": "tiny: BPE vocabulary trained on catalog + prompts."})
    # LoRA (peft)
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (paper: 8); 0 = full fine-tuning."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (paper: 16)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (paper: 0)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "Modules LoRA adapts (paper: q, v, o, gate, up, down)."},
    )
    dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16."})


@dataclass
class SFTConfig:
    epochs: float = field(default=1.0, metadata={"help": "Passes over D_sup."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many optimizer steps; -1 = epochs decide."})
    learning_rate: float = field(default=3e-3, metadata={"help": "SFT learning rate."})
    batch_size: int = field(default=16, metadata={"help": "Per-device batch size."})
    grad_accum: int = field(default=1, metadata={"help": "Gradient accumulation steps."})
    warmup_ratio: float = field(default=0.05, metadata={"help": "Linear warm-up share of steps."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    logging_steps: int = field(default=10, metadata={"help": "Log loss every this many steps."})
