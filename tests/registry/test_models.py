"""abpo.registry.models.pinned_requirements: what a logged model pins."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from abpo.registry.models import pinned_requirements


def test_pins_each_installed_package_at_its_version_without_a_local_label():
    pins = pinned_requirements(["torch", "mlflow"])
    assert pins == [f"torch=={md.version('torch').split('+')[0]}", f"mlflow=={md.version('mlflow')}"]


def test_mlflow_skinny_stands_for_mlflow_where_only_it_is_installed(monkeypatch):
    real = md.version

    def without_mlflow(name):
        if name == "mlflow":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", without_mlflow)
    assert pinned_requirements(["mlflow"]) == [f"mlflow-skinny=={real('mlflow-skinny')}"]


def test_a_package_that_is_not_installed_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="package 'no-such-package-abpo' is not installed"):
        pinned_requirements(["no-such-package-abpo"])
