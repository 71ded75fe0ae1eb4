"""Config section `sasrec`: SASRec-CE (abpo.baselines.sasrec), the sequential baseline of
benchmarks/policy_quality.py and the ML-retrain arm's model with ``arms.ml_retrain.kind: sasrec``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SASRecConfig:
    max_length: int = field(
        default=50,
        metadata={
            "min": 2,
            "help": "SASRec: items of history the model reads (the last N at scoring; training sequences are cut "
            "into windows of N that overlap by one item, as pi_init's stage 1).",
        },
    )
    blocks: int = field(default=2, metadata={"min": 1, "help": "SASRec: self-attention blocks."})
    heads: int = field(
        default=1, metadata={"min": 1, "help": "SASRec: attention heads per block (sasrec.hidden_size divisible)."}
    )
    hidden_size: int = field(
        default=64, metadata={"min": 2, "help": "SASRec: item embedding and hidden size (tied input/output)."}
    )
    dropout: float = field(
        default=0.2, metadata={"min": 0, "lt": 1, "help": "SASRec: dropout on embeddings, attention and FFN."}
    )
    epochs: int = field(
        default=100,
        metadata={
            "min": 1,
            "help": "SASRec: at most this many epochs when fitted with validation users (the offline rows, the "
            "arm's bootstrap fit): early stopping keeps the best epoch.",
        },
    )
    patience: int = field(
        default=3,
        metadata={
            "min": 1,
            "help": "SASRec early stopping: stop after this many epochs without a lower full-softmax loss of the "
            "validation users (experiment.validation_fraction) on their next items x_{T+1..T+N-1}.",
        },
    )
    refit_epochs: int = field(
        default=3,
        metadata={
            "min": 1,
            "help": "ML-retrain arm with kind sasrec: epochs of each monthly refit, warm-started from the champion's "
            "weights (no validation users there: the warehouse's months include their next items).",
        },
    )
    learning_rate: float = field(default=1e-3, metadata={"gt": 0, "help": "SASRec: Adam learning rate."})
    batch_size: int = field(
        default=32,
        metadata={
            "min": 1,
            "help": "SASRec: sequence windows per step (32: 72 steps per epoch on the bundled MovieLens; 128 gave 18 "
            "and HR@5 0.060 on the validation users after 6 epochs).",
        },
    )
    num_threads: int = field(
        default=1,
        metadata={
            "min": 0,
            "help": "SASRec: torch threads while fitting and scoring (restored after); 0 = torch's default. One "
            "thread is deterministic and fair beside pi_init's policy.num_threads: 1.",
        },
    )
