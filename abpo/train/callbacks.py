"""The trainer's transformers callbacks: the per-step metrics to MLflow (`MLflowStepCallback`) and a stop after a
given optimizer step (`StopAfterStepCallback`, the resume test and the benchmark)."""

from __future__ import annotations

import math
import time

from transformers import TrainerCallback

from abpo import registry
from abpo.train import signals


class MLflowStepCallback(TrainerCallback):
    """Logs every numeric value of each `Trainer.log` call (TRL's metrics: rewards per function, KL, entropy,
    clip ratios, step_time; ABPO's: abpo/*) to the active MLflow run at the optimizer step.

    The steps are written in batches (abpo.registry.log_metric_steps: each value with its own step and the time it
    was taken): every :data:`FLUSH_STEPS` logged steps, after each checkpoint is saved, at the end of training, and
    by :func:`flush_step_metrics` when training stops on an error or a signal. One store write per step cost the
    demo's all-row update about a sixth of its time (12 of 69 s of 458 steps, a SQLite transaction each); what a run shows when it ends is the same."""

    FLUSH_STEPS = 50

    def __init__(self):
        self.pending: list[tuple[dict[str, float], int, int]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or registry.active_run_id() is None:
            return
        metrics = {
            k: float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        }
        if metrics:
            self.pending.append((metrics, int(state.global_step), int(time.time() * 1000)))
        if len(self.pending) >= self.FLUSH_STEPS:
            self.flush()

    def on_save(self, args, state, control, **kwargs):
        self.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self.flush()

    def flush(self) -> None:
        """Write the steps logged since the last write into the active run (nothing without one)."""
        if not self.pending or registry.active_run_id() is None:
            return
        pending, self.pending = self.pending, []
        with signals.held():  # a SIGTERM inside the store's write would leave it locked (abpo.train.signals)
            registry.log_metric_steps(pending)


def flush_step_metrics(trainer) -> None:
    """Write what ``trainer``'s :class:`MLflowStepCallback` holds (training stopped before its end: an error, a
    signal)."""
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, MLflowStepCallback):
            cb.flush()


class StopAfterStepCallback(TrainerCallback):
    """Stops training after optimizer step `step` (after its checkpoint is written): simulates an interruption
    in the resume test and lets the benchmark time a fixed number of steps."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control
