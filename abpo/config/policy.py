"""Config sections `policy` (the LLM recommender) and `sft` (training pi_init on D_sup)."""

from __future__ import annotations

from dataclasses import dataclass, field

PROMPT_STYLES = ("text", "item_tokens")  # policy.prompt_style (abpo.policy.prompt builds both)
LOSS_TOKENS = ("answer", "choice")  # sft.loss_tokens (abpo.policy.sft)
ITEM_INITS = ("random", "als")  # sft.item_init (abpo.policy.item_init)
DTYPES = ("float32", "bfloat16")  # policy.dtype: torch's dtype of that name (abpo.policy.model.torch_dtype)
# policy.tau's lower bound. e_p = softmax(s_p / tau) is finite only while s_p / tau is: at a subnormal tau (1e-320)
# any score gap overflows float64 to inf, and the softmax gives NaN. At tau >= 1e-3 even the largest finite float32
# score (3.4e38) divided by tau stays below float64's range (1.8e308) by 260 orders of magnitude, whatever the model
# scores; and 1e-3 is already a hard argmax in practice (a gap of 0.75 nats weights the top candidate by e^750,
# beyond float64), so no useful temperature lies below it. The floor is numeric only: whether a tau above it makes the
# logging near-deterministic depends on the model's score gaps (at 1e-3 a top candidate 0.017 nats above each of 19
# others already has e0 within 1e-6 of 1), which the config cannot see; the ingest measures it on the month's logs and
# warns (abpo.warehouse.ingest.NEAR_ONE_PROPENSITY).
TAU_MIN = 1e-3


@dataclass
class PolicyConfig:
    model: str = field(
        default="tiny",
        metadata={
            "help": "tiny | smollm2-135m | gpu (gemma-3-4b-it, local weights only) | a local Hugging Face model "
            "directory or a hub id already in the local cache (loaded offline)."
        },
    )
    prompt_style: str = field(
        default="text",
        metadata={
            "choices": PROMPT_STYLES,
            "help": "text | item_tokens. text: the paper's prompt (history titles, candidate lines "
            "<item_id>ID</item_id><item>TITLE</item>, the instruction) and s_p = the mean log-prob over the whole "
            "answer (docs/ABPO_SPEC.md). item_tokens (needs one vocabulary token per item: the tiny model): the "
            "instruction, the candidate set as item tokens (policy.item_prompt_candidates), then the history as item "
            "tokens (the most recent last, right before the answer); the same answer format, and s_p = the log-prob "
            "of the answer's item token, the one token that chooses (abpo.policy.scoring). One builder (abpo.policy.prompt.request_prompt) serves "
            "SFT, logging, e_old, rollouts, serving and evaluation in both styles.",
        },
    )
    item_prompt_candidates: bool = field(
        default=True,
        metadata={
            "help": "item_tokens only: list the candidate set in the prompt. false = the prompt holds the instruction "
            "and the history only, and the candidate set acts through the constraint alone (scoring and rollouts "
            "over C's item tokens). Chosen on the validation users (docs/policy.md, 'The policy')."
        },
    )
    max_history: int = field(
        default=10,
        metadata={
            "min": 0,
            "help": "Most recent history items shown in the prompt (text: titles; item_tokens: item tokens).",
        },
    )
    max_prompt_tokens: int = field(
        default=4096,
        metadata={
            "min": 1,
            "help": "Prompt token budget; over it the oldest history items are dropped first (never candidates).",
        },
    )
    history_item_ids: bool = field(
        default=False,
        metadata={
            "help": "Show history items like candidates (<item_id>ID</item_id><item>TITLE</item>) instead of "
            "numbered titles. Every prompt (SFT, evaluation, D_bandit, the update's rollouts and e_old, serving) is "
            "built by abpo.policy.prompt.request_prompt, so the setting holds everywhere. Measured "
            "on tiny: HR@5 0.130 vs 0.123 without (300 users; within noise)."
        },
    )
    tau: float = field(
        default=1.0,
        metadata={
            "min": TAU_MIN,
            "help": "Temperature of e_p(a|q) = softmax(s_p(a,q)/tau) over C; at least 0.001, where the softmax of "
            "any finite score stays finite (abpo.config.policy.TAU_MIN). A small tau makes the logging "
            "near-deterministic (how small depends on the model's score gaps): the ingest warns when over half of an "
            "arm's rows with two or more candidates logged e0 >= 1 - 1e-6, which gives the off-policy gate no support "
            "beyond the served item; raise policy.tau then.",
        },
    )
    scoring_batch_tokens: int = field(
        default=16384,
        metadata={
            "min": 1,
            "help": "Memory bound of shared-prefix scoring: token positions per forward (prompt + the chunk's "
            "packed answer tokens; at least one answer per chunk).",
        },
    )
    max_answer_tokens: int = field(
        default=96,
        metadata={"min": 1, "help": "Generation limit for one answer <item_id>ID</item_id><item>TITLE</item>."},
    )
    generation_batch_size: int = field(
        default=8, metadata={"min": 1, "help": "Prompts per batch for greedy generation."}
    )
    constrained_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Update rollouts may only name a candidate of their request: at each step only tokens that "
            "continue a well-formed answer <item_id>ID</item_id><item>TITLE</item> of C (+ EOS) are allowed "
            "(abpo.policy.constrained). The update's log-probs are then those of the constrained policy. On in the "
            "CPU presets (tiny, smollm2), off at GPU scale (the paper samples freely; vLLM has no such hook here)."
        },
    )
    # tiny model shape (used when model == tiny)
    tiny_hidden_size: int = field(default=128, metadata={"min": 1, "help": "tiny: hidden size."})
    tiny_layers: int = field(default=2, metadata={"min": 1, "help": "tiny: decoder layers."})
    tiny_heads: int = field(default=4, metadata={"min": 1, "help": "tiny: attention heads."})
    tiny_intermediate_size: int = field(default=256, metadata={"min": 1, "help": "tiny: MLP width."})
    tiny_vocab_size: int = field(
        default=4096, metadata={"min": 1, "help": "tiny: BPE vocabulary trained on catalog + prompts."}
    )
    # LoRA (peft)
    lora_r: int = field(default=8, metadata={"min": 0, "help": "LoRA rank (paper: 8); 0 = full fine-tuning."})
    lora_alpha: int = field(default=16, metadata={"min": 1, "help": "LoRA alpha (paper: 16)."})
    lora_dropout: float = field(default=0.0, metadata={"min": 0, "lt": 1, "help": "LoRA dropout (paper: 0)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "Modules LoRA adapts (paper: q, v, o, gate, up, down)."},
    )
    lora_train_embeddings: bool = field(
        default=False,
        metadata={
            "help": "With LoRA: also train the input embeddings and the LM head in full (peft modules_to_save, kept "
            "tied), where an item-token model keeps its per-item knowledge; a LoRA on attention and MLP alone cannot "
            "move them. Full fine-tuning (lora_r = 0) trains them anyway."
        },
    )
    dtype: str = field(default="float32", metadata={"choices": DTYPES, "help": "float32 | bfloat16."})
    num_threads: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "CPU threads torch uses once load_policy ran (torch.set_num_threads); 0 = torch's default. "
            "1 is the robust choice for the tiny model on a shared machine: with 2 threads, each of its many small "
            "ops waits for the slower thread, several times slower when another process holds a core.",
        },
    )


@dataclass
class SFTConfig:
    item_init: str = field(
        default="random",
        metadata={
            "choices": ITEM_INITS,
            "help": "pi_init's item-token rows (embedding, tied with the LM head) before stage 1: random (the model's "
            "init) | als: from the item factors of the project's ALS (abpo.baselines.als at its defaults, rank "
            "policy.tiny_hidden_size) fitted on every user's x_{1:T}, the data stage 1 trains on, rescaled by one "
            "scalar to the random rows' mean norm; items without a training interaction keep their random row "
            "(Eq. item-init, abpo.policy.item_init). Needs one token per item (the tiny model).",
        },
    )
    pretrain_epochs: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "pi_init stage 1 (abpo.policy.pretrain): at most this many epochs of next-item pre-training over "
            "every position of each user's item-token sequence x_{1:T} (full softmax over the catalog's item "
            "tokens), before the answer-format SFT (stage 2). Needs one token per item (the tiny model); 0 = off.",
        },
    )
    pretrain_learning_rate: float = field(
        default=3e-3, metadata={"gt": 0, "help": "Stage 1 peak learning rate (AdamW, cosine)."}
    )
    pretrain_batch_size: int = field(default=32, metadata={"min": 1, "help": "Stage 1: sequence windows per step."})
    pretrain_max_length: int = field(
        default=200,
        metadata={"min": 2, "help": "Stage 1: window length in items (long sequences are cut, one item overlap)."},
    )
    pretrain_patience: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "Stage 1 early stopping: stop after this many epochs without a lower loss of the validation "
            "users (experiment.validation_fraction) on their next items x_{T+1..T+N-1}; the best epoch is kept.",
        },
    )
    loss_tokens: str = field(
        default="answer",
        metadata={
            "choices": LOSS_TOKENS,
            "help": "Stage 2's loss: answer (every answer token + EOS: r(a) of a text model) | choice (the answer's "
            "item token only; policy.prompt_style=item_tokens). With one token per item the rest of the answer "
            "(<item>TITLE</item>, EOS) is forced by the item under constrained decoding and carries no choice; "
            "learning to copy ~15 title tokens through the tied item embeddings cost the tiny model its next-item "
            "ranking on the validation users (docs/policy.md, 'pi_init').",
        },
    )
    epochs: float = field(default=1.0, metadata={"gt": 0, "help": "Passes over D_sup."})
    max_steps: int = field(
        default=-1, metadata={"min": -1, "help": "Stop after this many optimizer steps; -1 = epochs decide."}
    )
    learning_rate: float = field(default=3e-3, metadata={"gt": 0, "help": "SFT learning rate."})
    batch_size: int = field(default=16, metadata={"min": 1, "help": "Per-device batch size."})
    grad_accum: int = field(default=1, metadata={"min": 1, "help": "Gradient accumulation steps."})
    warmup_ratio: float = field(default=0.05, metadata={"min": 0, "max": 1, "help": "Linear warm-up share of steps."})
    weight_decay: float = field(default=0.01, metadata={"min": 0, "help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"min": 0, "help": "Gradient clipping norm."})
    logging_steps: int = field(default=10, metadata={"min": 1, "help": "Log loss every this many steps."})
    use_lora: bool = field(
        default=True,
        metadata={"help": "Train LoRA adapters (policy.lora_*) and merge them; false = full fine-tuning (tiny)."},
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Trade compute for memory (GPU scale)."})
    max_examples: int = field(
        default=0, metadata={"min": 0, "help": "Train on at most this many D_sup examples (seeded choice); 0 = all."}
    )
    eval_max_users: int = field(
        default=0,
        metadata={"min": 0, "help": "Evaluate pi_init on at most this many held-out users (seeded); 0 = all."},
    )
    eval_generation: bool = field(
        default=True, metadata={"help": "Also report HR@1 by greedy generation (and the malformed-answer share)."}
    )
    experiment: str = field(default="abpo-sft", metadata={"help": "MLflow experiment of the SFT run."})
    output: str = field(
        default="pi_init", metadata={"help": "Directory (under paths.models) the SFT'd pi_init is saved to."}
    )
