"""The trainer's MLflow callback (abpo.train.callbacks.MLflowStepCallback) writes every logged step's metrics, with
its step and the time it was taken, in batches: every FLUSH_STEPS steps, after a checkpoint, at the end of training,
and when training stops early (flush_step_metrics). A real SQLite MLflow store; the trainer's events called as
transformers calls them (tests/train/test_trainer.py trains a real update through it)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from abpo import registry
from abpo.train.callbacks import MLflowStepCallback, flush_step_metrics


@pytest.fixture
def run(tmp_path):
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    with registry.start_run(cfg, "test-callbacks", "steps") as r:
        yield r


def _history(run_id, key):
    from mlflow import MlflowClient

    return MlflowClient().get_metric_history(run_id, key)


def _log(cb, step, **metrics):
    state = SimpleNamespace(is_world_process_zero=True, global_step=step)
    cb.on_log(None, state, None, logs=metrics)


def test_every_step_reaches_the_run_in_batches(run, monkeypatch):
    writes = []
    real = registry.log_metric_steps
    monkeypatch.setattr(registry, "log_metric_steps", lambda steps: (writes.append(len(steps)), real(steps)))
    cb = MLflowStepCallback()
    t0 = int(time.time() * 1000)
    for step in range(1, 121):
        _log(cb, step, loss=1.0 / step, flag=True, text="x", nan=float("nan"))  # only finite numbers are kept
    assert writes == [50, 50] and len(cb.pending) == 20  # two store writes for 100 steps, not 100
    assert [m.step for m in _history(run.info.run_id, "loss")] == list(range(1, 101))
    cb.on_save(None, None, None)  # a checkpoint: what it resumes from is in the run too
    assert writes == [50, 50, 20] and not cb.pending
    _log(cb, 121, loss=0.5)
    cb.on_train_end(None, None, None)
    hist = _history(run.info.run_id, "loss")
    assert [m.step for m in hist] == list(range(1, 122))
    assert hist[0].value == 1.0 and hist[-1].value == 0.5
    assert all(t0 <= m.timestamp <= int(time.time() * 1000) for m in hist)  # each value keeps its own time
    assert [m.timestamp for m in hist] == sorted(m.timestamp for m in hist)
    assert not _history(run.info.run_id, "flag") and not _history(run.info.run_id, "nan")


def test_a_training_stopped_early_keeps_what_it_logged(run):
    """train_update's finally: an error or a signal in step 7 leaves steps 1-6 in the run."""
    cb = MLflowStepCallback()
    for step in range(1, 7):
        _log(cb, step, loss=float(step))
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[object(), cb]))
    flush_step_metrics(trainer)
    assert [m.step for m in _history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]
    flush_step_metrics(trainer)  # nothing pending: no second write
    assert len(_history(run.info.run_id, "loss")) == 6


def test_more_than_mlflows_batch_limit_is_split(run):
    """One flush of 60 steps x 20 metrics = 1,200 values: over MLflow's 1,000 per log_batch, written in two calls."""
    cb = MLflowStepCallback()
    cb.FLUSH_STEPS = 60
    for step in range(1, 61):
        _log(cb, step, **{f"m{i}": float(step * i) for i in range(20)})
    assert not cb.pending
    assert [m.step for m in _history(run.info.run_id, "m19")] == list(range(1, 61))
    assert _history(run.info.run_id, "m19")[-1].value == 60.0 * 19


def test_no_run_no_write():
    cb = MLflowStepCallback()
    _log(cb, 1, loss=1.0)
    assert not cb.pending
