"""abpo.registry is a package split along its seams (store, tasks, models, versions, weights, errors): every name
stays importable from abpo.registry, and its errors keep abpo.registry as their module path (the orchestrator's
retry table, abpo.monthly.common.TRANSIENT, names them by that path). And it is the one door to MLflow: no other
module of abpo imports mlflow (the import-linter contract, which must name every other module) or configures
tracking itself."""

import importlib
from pathlib import Path

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


# ------------------------------------------------------------------------------ the one door to MLflow (issue 45.4)
ROOT = Path(__file__).resolve().parents[2]


def _mlflow_contract() -> dict:
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in linter["contracts"] if c.get("forbidden_modules") == ["mlflow"]]
    assert str(linter["include_external_packages"]).lower() == "true"  # else import-linter refuses the contract
    return contract


def test_the_mlflow_contract_covers_every_module_of_abpo_but_the_registry():
    top = {
        f"abpo.{p.stem}"
        for p in (ROOT / "abpo").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    contract = _mlflow_contract()
    assert sorted(top - {"abpo.registry"}) == sorted(contract["source_modules"]), "a new module joins the contract"


def _python_files_outside_the_registry():
    for path in sorted((ROOT / "abpo").rglob("*.py")):
        if "registry" not in path.relative_to(ROOT / "abpo").parts[:1]:
            yield path


def test_no_module_outside_the_registry_imports_mlflow_but_those_the_contract_still_ignores():
    import ast

    ignored = {line.split(" -> ")[0] for line in _mlflow_contract().get("ignore_imports", [])}
    found = set()
    for path in _python_files_outside_the_registry():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert found <= ignored, f"import mlflow outside abpo.registry: {sorted(found - ignored)}"


def test_tracking_is_configured_by_the_registry_alone():
    """No module outside abpo/registry calls configure(cfg): the registry's functions that take cfg do, once per
    process and store."""
    import ast

    calls = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _python_files_outside_the_registry()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "configure"
    ]
    assert not calls, f"configure() called outside abpo.registry: {calls}"
