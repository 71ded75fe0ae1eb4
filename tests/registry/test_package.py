"""abpo.registry is a package split along its seams (store, tasks, models, versions, weights, errors): every name
stays importable from abpo.registry, and its errors keep abpo.registry as their module path (the orchestrator's
retry table, abpo.monthly.common.TRANSIENT, names them by that path)."""

import importlib

from abpo import registry


def test_every_name_is_importable_from_the_package_and_is_the_parts_own():
    for name in registry.__all__:
        obj = getattr(registry, name)
        home = getattr(obj, "__module__", None)
        if callable(obj) and home not in (None, "abpo.registry"):
            assert getattr(importlib.import_module(home), name) is obj, name


def test_the_errors_keep_their_module_path_and_the_retry_table_still_finds_them():
    from abpo.monthly.common import retry_or_fail

    for cls in (registry.RegistryUnavailable, registry.ModelFilesDamaged, registry.StateMoved):
        assert cls.__module__ == "abpo.registry" and getattr(registry, cls.__name__) is cls
    assert retry_or_fail(registry.RegistryUnavailable("store down")) == "retry"
    assert retry_or_fail(registry.StateMoved("moved")) == "fail"  # a ValueError: refused
