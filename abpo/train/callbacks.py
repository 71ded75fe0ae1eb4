"""The trainer's transformers callbacks: the per-step metrics to MLflow (`MLflowStepCallback`) and a stop after a
given optimizer step (`StopAfterStepCallback`, the resume test and the benchmark)."""

from __future__ import annotations

import math

from transformers import TrainerCallback

from abpo import registry
from abpo.train import signals


class MLflowStepCallback(TrainerCallback):
    """Logs every numeric value of each `Trainer.log` call (TRL's metrics: rewards per function, KL, entropy,
    clip ratios, step_time; ABPO's: abpo/*) to the active MLflow run at the optimizer step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or registry.active_run_id() is None:
            return
        metrics = {
            k: float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        }
        if metrics:
            with signals.held():  # a SIGTERM inside the store's write would leave it locked (abpo.train.signals)
                registry.log_metrics(metrics, step=int(state.global_step))


class StopAfterStepCallback(TrainerCallback):
    """Stops training after optimizer step `step` (after its checkpoint is written): simulates an interruption
    in the resume test and lets the benchmark time a fixed number of steps."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control
