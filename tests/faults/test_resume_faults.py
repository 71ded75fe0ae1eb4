"""An update resumes only its own checkpoints (issue 48, item 3): a rerun into the same output with another variant,
learning rate, seed, starting model or other rows (a killed update's checkpoints left there) starts fresh and says so
in the log, instead of continuing the other update's optimizer state and steps."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest


def _rows(n: int = 4, offset: int = 0) -> pa.Table:
    return pa.table({"impression_id": [f"i{k + offset}" for k in range(n)], "clicked": [k % 2 == 0 for k in range(n)]})


def _killed_update(out, key) -> None:
    """What a killed run_update leaves: checkpoints and the key it recorded when it started."""
    (out / "checkpoints" / "checkpoint-75").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-75" / "trainer_state.json").write_text("{}")
    from abpo.train.update import RESUME_KEY

    (out / RESUME_KEY).write_text(json.dumps(key))


@pytest.mark.parametrize(
    "change",
    ["variant", "learning_rate", "seed", "data", "init_model"],
)
def test_another_updates_checkpoints_are_not_resumed(make_cfg, tmp_path, change):
    from abpo.train.update import resume_decision, resume_key

    cfg = make_cfg()
    init = tmp_path / "pi_init"
    written = resume_key(cfg, "abpo", init, (_rows(), _rows(2, 10)))
    out = tmp_path / "update-out"
    _killed_update(out, written)
    assert resume_decision(out, True, written) == (True, "")  # the same update: resumes

    variant, rows, start = "abpo", (_rows(), _rows(2, 10)), init
    if change == "variant":
        variant = "grpo"
    elif change == "learning_rate":
        cfg = dataclasses.replace(
            cfg, update=dataclasses.replace(cfg.update, learning_rate=cfg.update.learning_rate * 3)
        )
    elif change == "seed":
        cfg = dataclasses.replace(cfg, seed=cfg.seed + 1)
    elif change == "data":
        rows = (_rows(), _rows(2, 11))
    else:
        start = tmp_path / "another-model"
    now = resume_key(cfg, variant, start, rows)
    resume, why = resume_decision(out, True, now)
    assert resume is False and "not resuming its checkpoints" in why and "starting fresh" in why, why
    field = {"variant": "variant", "learning_rate": "config", "seed": "seed", "data": "data"}.get(change, "init_model")
    assert f"their {field} differ" in why, why


def test_checkpoints_without_a_recorded_key_are_not_resumed_and_logging_steps_do_not_matter(make_cfg, tmp_path):
    from abpo.train.update import RESUME_KEY, resume_decision, resume_key

    cfg = make_cfg()
    key = resume_key(cfg, "abpo", tmp_path / "m", (_rows(),))
    out = tmp_path / "out"
    _killed_update(out, key)
    (out / RESUME_KEY).unlink()  # an older abpo's checkpoints
    assert resume_decision(out, True, key) == (
        False,
        f"update {out}: not resuming its checkpoints (no resume key is recorded beside them: they were written by "
        "another update into the same output); starting fresh",
    )
    cfg2 = dataclasses.replace(cfg, update=dataclasses.replace(cfg.update, logging_steps=7, save_steps=3))
    assert resume_key(cfg2, "abpo", tmp_path / "m", (_rows(),)) == key  # how often it logs / saves: the same update
    assert resume_decision(out, False, key) == (False, "")  # resume off: nothing to decide
    assert resume_decision(out, str(out / "checkpoints" / "checkpoint-75"), key)[0].endswith("checkpoint-75")


def _whole_checkpoint(path, step: int) -> None:
    """What the Trainer's save of a LoRA update's checkpoint writes, in its order: the adapter and its config, the
    training arguments, the optimizer, scheduler and RNG states, then trainer_state.json."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    save_file({"lora_A": np.zeros((4, 4), dtype=np.float32)}, str(path / "adapter_model.safetensors"))
    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"x": torch.zeros(8)}, path / name)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))


@pytest.mark.parametrize("fault", ["killed_in_save", "truncated_safetensors", "truncated_optimizer"])
def test_a_broken_checkpoint_is_skipped_with_its_reason_and_the_last_whole_one_resumed(tmp_path, caplog, fault):
    """A SIGKILL inside the save of checkpoint-20 (its files up to the optimizer's written, no trainer_state.json),
    or a truncated model or optimizer file in it: the resume skips it, says which and why on one line, and starts
    from checkpoint-10. Before, every later run failed on it (FileNotFoundError, SafetensorError)."""
    import logging

    from abpo.train.update import resume_point

    out = tmp_path / "update-out"
    _whole_checkpoint(out / "checkpoints" / "checkpoint-10", 10)
    broken = out / "checkpoints" / "checkpoint-20"
    _whole_checkpoint(broken, 20)
    if fault == "killed_in_save":
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
            (broken / name).unlink()
        why = "no trainer_state.json (its save did not finish"
    else:
        name = "adapter_model.safetensors" if fault == "truncated_safetensors" else "optimizer.pt"
        data = (broken / name).read_bytes()
        (broken / name).write_bytes(data[: len(data) // 2])
        why = f"{name}: not a whole {'safetensors' if name.endswith('safetensors') else 'torch weights'} file"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="abpo.train.update"):
        assert resume_point(out, True) == str(out / "checkpoints" / "checkpoint-10")
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"not resuming from {broken}: {why}" in line and "resuming from checkpoint-10" in line, line
    assert "rule: a training resumes only from a whole checkpoint" in line and "\n" not in line


def test_no_whole_checkpoint_starts_fresh_and_says_so(tmp_path, caplog):
    import logging

    from abpo.train.update import resume_point

    out = tmp_path / "update-out"
    _whole_checkpoint(out / "checkpoints" / "checkpoint-20", 20)
    (out / "checkpoints" / "checkpoint-20" / "adapter_model.safetensors").unlink()
    with caplog.at_level(logging.WARNING, logger="abpo.train.update"):
        assert resume_point(out, True) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "checkpoint-20: missing " in line and line.endswith("starting fresh"), line
    _whole_checkpoint(out / "checkpoints" / "checkpoint-5", 5)
    assert resume_point(out, True) == str(out / "checkpoints" / "checkpoint-5")
    assert resume_point(out, False) is None
