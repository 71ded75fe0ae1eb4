"""Config section `update`: the ABPO update (every knob of docs/ABPO_SPEC.md's update step), TRL-style.

Each field maps either to an ABPO equation (group_size, delta, eps_std, lambda_sc, w_max) or to the
`trl.GRPOConfig` / `transformers.TrainingArguments` field named in its help; `abpo.train.grpo_args.grpo_kwargs`
does the mapping. The section says how every update trains; what one update trains (the variant, the arm whose
logs, the months, the starting model, the output directory) differs from call to call and is an argument instead:
`abpo.train.runs.UpdateRun` (the `abpo update` flags, the arm being refreshed, the experiment's row and round). The propensity temperature tau of e_p(a|q) = softmax(s_p/tau) is `policy.tau`: e_old must use
the same tau as the logging policy's e0, so it is deliberately not duplicated here. LoRA shape: `policy.lora_*`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from abpo.data.batching import STRATIFICATIONS

# The choices of these keys, refused at load when anything else (abpo.config.values); the code that dispatches on them
# reads the same tuples: update.ratio_level (abpo.algo.surrogate, abpo.train.trainer), update.loss_type
# (abpo.train.trainer), update.no_response_weight_rule (abpo.algo.stratum_weight). update.stratification's are
# abpo.data.batching's STRATIFICATIONS (the batches are filled there, below the config).
RATIO_LEVELS = ("sequence", "geometric", "token")
LOSS_TYPES = ("grpo",)
NO_RESPONSE_WEIGHT_RULES = ("fixed", "click_rate")


@dataclass
class UpdateConfig:
    # ------------------------------------------------------------------ the ABPO equations (docs/ABPO_SPEC.md)
    group_size: int = field(
        default=4,
        metadata={
            "min": 3,
            "help": "G (paper: 16). Anchored variants C-F: the logged anchor plus G-1 sampled rollouts "
            "(TRL num_generations = G-1); vanilla GRPO (B): G sampled rollouts. Must leave >= 2 rollouts.",
        },
    )
    grpo_equal_samples: bool = field(
        default=False,
        metadata={
            "help": "Vanilla GRPO (B) samples G-1 rollouts instead of G, the count the anchored variants C-F "
            "sample, so that B and F compare at equal sampled completions (and equal generation cost)."
        },
    )
    delta: float = field(
        default=1e-6, metadata={"gt": 0, "help": "delta in w_hat_i = w_i / (mean_{k in B_y} w_k + delta) (step 3)."}
    )
    eps_std: float = field(
        default=1e-4,
        metadata={
            "gt": 0,
            "help": "eps_std inside sigma_i = sqrt(weighted variance + eps_std) (step 4); also B's group std.",
        },
    )
    lambda_sc: float = field(
        default=0.1,
        metadata={
            "min": 0,
            "help": "lambda_sc: weight of the self-certainty reward r_sc of no-response (y=0) rows (step 2).",
        },
    )
    self_certainty_positions: str = field(
        default="choice",
        metadata={
            "help": "The tokens r_sc of step 2 averages KL(U || pi_theta) over: choice (default): where the "
            "candidates' answers branch (the item token of an item-token model, the id tokens of a text model) | "
            "answer: all T tokens of the answer (choice token, title tokens and EOS), r_sc as the paper defines it. "
            "With the item-token preset's SFT (sft.loss_tokens=choice) the title tokens were never trained, so "
            "under answer their entropies reflect an untrained LM head (they favour items whose titles the base "
            "model happens to continue confidently), not the policy's certainty about its choice."
        },
    )
    w_max: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "Optional cap on the raw SNIPS weight w_i = e_old/e0 before self-normalisation; 0 = no cap "
            "(the spec has none: leave 0 to reproduce it).",
        },
    )
    # ------------------------------------------------------------------ terms beside the paper's
    no_response_weight: float = field(
        default=1.0,
        metadata={
            "min": 0,
            "help": "kappa: the weight of the no-response (y=0) rows' surrogate terms, clicks weigh 1 "
            "(docs/update-variants.md Eq. N1; abpo.algo.stratum_weight). 1 = the paper. With "
            "no_response_weight_rule=click_rate it scales c/(1-c).",
        },
    )
    click_weight: float = field(
        default=1.0,
        metadata={
            "min": 0,
            "help": "nu_1: the weight of the clicked (y=1) rows' surrogate terms (docs/update-variants.md Eq. N1). "
            "1 = the paper. 0 with no_response_weight=1 trains on the no-responses only, the clicks-only update is "
            "no_response_weight=0 (a diagnosis of which stratum moves the policy).",
        },
    )
    no_response_weight_rule: str = field(
        default="fixed",
        metadata={
            "choices": NO_RESPONSE_WEIGHT_RULES,
            "help": "fixed: kappa = no_response_weight | click_rate: kappa = no_response_weight x c/(1-c), c the "
            "click rate of the logged rows the update trains on (before the stratified batches oversample clicks): "
            "a bandit policy gradient baselined at c weighs a no-response c/(1-c) as much as a click (Eq. N2). "
            "Variants grpo_cr and abpo_cr fix click_rate.",
        },
    )
    surrogate_weight: float = field(
        default=1.0,
        metadata={
            "min": 0,
            "help": "Weight of the step-5 clipped surrogate (the GRPO term); 0 turns it off, leaving the terms "
            "below (variant wll: the weighted log-likelihood alone). 1 = the paper.",
        },
    )
    likelihood_weight: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "lambda_ll: weight of the SNIPS-weighted log-likelihood of the clicked logged items "
            "(docs/update-variants.md Eq. L1, the supervised anchor of ReRe / AdaGRPO). 0 = off (the paper); "
            "variants abpo_ll, grpo_ll and wll fix 1. Any updating variant may add it.",
        },
    )
    offpolicy_weight: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "lambda_off: weight of the logged anchor's own shaped, clipped importance-weighted term "
            "(docs/update-variants.md Eqs. O1-O3, LUFFY's policy shaping). 0 = off (the paper: the anchor has no "
            "term); variant abpo_offpolicy fixes 1. Any updating variant may add it.",
        },
    )
    offpolicy_gamma: float = field(
        default=0.1,
        metadata={
            "gt": 0,
            "help": "gamma of the policy shaping f(x) = x/(x+gamma) in the off-policy anchor term (LUFFY: 0.1).",
        },
    )
    # ------------------------------------------------------------------ the surrogate (step 5) -> GRPOConfig
    epsilon: float = field(
        default=0.2, metadata={"gt": 0, "help": "Clip range eps of s_i^j in the surrogate (GRPOConfig.epsilon)."}
    )
    beta: float = field(
        default=0.0,
        metadata={
            "min": 0,
            "help": "KL regulariser weight to the update's starting policy (GRPOConfig.beta; pi_init on the first "
            "update, the champion it refreshes after): J -= beta x k3 KL on the rollouts' tokens (abpo.algo.surrogate)."
            " 0 = off (spec: optional). Any updating variant may add it.",
        },
    )
    ratio_level: str = field(
        default="sequence",
        metadata={
            "choices": RATIO_LEVELS,
            "help": "How s_i^j of step 5 is formed (abpo.algo.surrogate.clipped_surrogate): sequence (the spec: "
            "pi_theta(a|q)/pi_old(a|q), the product over the completion's tokens; default) | geometric (its "
            "length-normalised root, GSPO) | token (one clipped ratio per token averaged over the completion, TRL's "
            "classic GRPO loss). Every level keeps the spec's mean over rollouts: each rollout weighs 1/(B(G-1)).",
        },
    )
    loss_type: str = field(
        default="grpo",
        metadata={
            "choices": LOSS_TYPES,
            "help": "GRPOConfig.loss_type; only grpo is accepted. The loss itself is ABPO's (step 5, computed by "
            "abpo.algo.surrogate per ratio_level); TRL's dapo/bnpo/dr_grpo/cispo weight completions by batch "
            "token counts, which breaks the (1/(G-1)) mean over rollouts of step 5, so they are refused.",
        },
    )
    # ------------------------------------------------------------------ optimisation -> TrainingArguments
    learning_rate: float = field(default=5e-4, metadata={"gt": 0, "help": "Peak learning rate (paper: 5e-5)."})
    batch_size: int = field(
        default=4,
        metadata={
            "min": 1,
            "help": "Logged examples per micro-batch over all processes (paper: 4; CPU preset: 16, i.e. 48 rollouts "
            "in one generate call and one loss pass: fewer, better-vectorised steps); each of N processes trains "
            "batch_size / N of them (N must divide it): TRL per_device_train_batch_size = batch_size / N x rollouts "
            "per example, so the update is the same whatever N.",
        },
    )
    grad_accum: int = field(
        default=1,
        metadata={
            "min": 1,
            "help": "Gradient accumulation steps (paper: 8). One optimizer step = batch_size x grad_accum "
            "logged examples = one generation batch = the SNIPS mini-batch (stratified: both y in it).",
        },
    )
    epochs: float = field(default=1.0, metadata={"gt": 0, "help": "Passes over D_bandit (paper: 1)."})
    max_steps: int = field(
        default=-1, metadata={"min": -1, "help": "Stop after this many optimizer steps; -1 = epochs decide."}
    )
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "transformers scheduler name (linear, cosine, ...)."}
    )
    warmup_ratio: float = field(
        default=0.05, metadata={"min": 0, "max": 1, "help": "Linear warm-up share of the steps (paper: 0.05)."}
    )
    weight_decay: float = field(default=0.01, metadata={"min": 0, "help": "Weight decay (paper: 0.01)."})
    max_grad_norm: float = field(default=1.0, metadata={"min": 0, "help": "Gradient clipping norm (paper: 1.0)."})
    optim: str = field(
        default="adamw_torch",
        metadata={"help": "transformers optimizer name (paper: paged_adamw_8bit, needs bitsandbytes)."},
    )
    # ------------------------------------------------------------------ rollouts
    temperature: float = field(
        default=1.0, metadata={"gt": 0, "help": "Rollout sampling temperature (GRPOConfig.temperature)."}
    )
    top_p: float = field(
        default=1.0, metadata={"gt": 0, "max": 1, "help": "Rollout nucleus sampling (GRPOConfig.top_p); 1 = off."}
    )
    max_completion_length: int = field(
        default=48,
        metadata={
            "min": 1,
            "help": "Max new tokens per rollout; an answer is <item_id>ID</item_id><item>TITLE</item>.",
        },
    )
    greedy_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Rollouts take the most likely answer (HF generate do_sample=False; constrained rollouts the "
            "argmax of Eq. q) instead of sampling at update.temperature: deterministic, for checks that compare "
            "launches (2 processes vs 1, docs/distributed.md). Every rollout of a group is then the same, so only "
            "the anchored variants (C-F) still learn. Off = the spec's sampled rollouts."
        },
    )
    use_vllm: bool = field(
        default=False, metadata={"help": "Generate rollouts with vLLM (GPU only; needs the gpu extra)."}
    )
    vllm_mode: str = field(
        default="colocate", metadata={"help": "vLLM mode: colocate (same GPU as training) | server (trl vllm-serve)."}
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"gt": 0, "max": 1, "help": "GPU memory share vLLM may take in colocate mode."}
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={
            "help": "TRL's truncated importance-sampling correction of vLLM rollouts (weights each token by "
            "pi_train/pi_vLLM). Not part of docs/ABPO_SPEC.md step 5, and it costs an extra forward pass: off. Turn on "
            "only if vLLM's sampling numerics drift visibly from the trained model's (bf16 kernels)."
        },
    )
    # ------------------------------------------------------------------ hardware
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPU preset). Off on CPU."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Gradient checkpointing (GPU preset)."})
    deepspeed: str = field(
        default="",
        metadata={
            "help": "DeepSpeed JSON config, repo-relative or absolute (GPU preset: configs/deepspeed_zero2.json; "
            "it runs on the CPU too, over DeepSpeed's CPU accelerator: docs/distributed.md). Needs the "
            "distributed extra (pip install 'abpo[distributed]')."
        },
    )
    processes: int = field(
        default=1,
        metadata={
            "min": 1,
            "help": "Processes of the monthly arm update (Airflow task <arm>.update): above 1 the task launches "
            "`torchrun --nproc_per_node N` running the update data-parallel (CPU: gloo; GPU: one per GPU), its "
            "inputs from a file, its result through update.json (docs/distributed.md). update.batch_size is the "
            "batch over all processes and must be divisible by N. `abpo update` itself runs as the processes it "
            "was launched as.",
        },
    )
    # ------------------------------------------------------------------ data, checkpoints, logging
    max_examples: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "Use at most this many logged rows (seeded draw, both strata kept in proportion); 0 = the whole "
            "log (both presets). A cap for quick experiments.",
        },
    )
    stratification: str = field(
        default="oversample",
        metadata={
            "choices": STRATIFICATIONS,
            "help": "How stratified SNIPS mini-batches are filled (abpo.warehouse.stratified_batches): oversample "
            "(default: every batch holds round(B*P/(P+N)) >= 1 positives; the scarcer stratum is recycled in a "
            "fresh seeded order, so some of its rows appear twice in the epoch) | proportional (each row once; "
            "positives spread evenly over floor((P+N)/B) batches; the rows that fill no batch are reported).",
        },
    )
    save_steps: int = field(
        default=20, metadata={"min": 1, "help": "Checkpoint every this many optimizer steps (the resume point)."}
    )
    save_total_limit: int = field(
        default=2, metadata={"min": 0, "help": "Keep at most this many checkpoints (0 = keep all)."}
    )
    resume: bool = field(
        default=True,
        metadata={"help": "Resume from the last checkpoint in the update directory when one exists."},
    )
    save_merged: bool = field(
        default=True,
        metadata={
            "help": "Also save the LoRA-merged full model next to the adapter (off at GPU scale: 8 GB). "
            "`abpo update` only: the monthly arms always save it, since serving loads it."
        },
    )
    logging_steps: int = field(
        default=1, metadata={"min": 1, "help": "Log metrics (MLflow) every this many optimizer steps."}
    )
    mlflow_experiment: str = field(default="abpo-update", metadata={"help": "MLflow experiment of update runs."})
