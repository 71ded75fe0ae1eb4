"""abpo.train.update.reproducible_on_cpu: an update on the CPU trains in torch's deterministic mode (run to run the
same weights with 2 threads), the setting restored after."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def test_an_update_trains_in_torchs_deterministic_mode_on_the_cpu_and_restores_it():
    """abpo.train.update.reproducible_on_cpu: with 2 threads an op of the ABPO step accumulated in a thread-dependent
    order (the demo's abpo update, 6 steps: three runs, three weights files; in deterministic mode one). Inside, a
    CPU model trains in deterministic mode; the setting before is restored after, an error included; a model with a
    parameter off the CPU is left alone."""
    import torch

    from abpo.train.update import reproducible_on_cpu

    model = torch.nn.Linear(2, 2)
    assert not torch.are_deterministic_algorithms_enabled()
    with reproducible_on_cpu(model):
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError), reproducible_on_cpu(model):
        raise RuntimeError("a step failed")
    assert not torch.are_deterministic_algorithms_enabled()
    off_cpu = SimpleNamespace(parameters=lambda: [SimpleNamespace(device=SimpleNamespace(type="cuda"))])
    with reproducible_on_cpu(off_cpu):
        assert not torch.are_deterministic_algorithms_enabled()
