"""A registered arm with versions for the promotion and rollback fault tests."""

from __future__ import annotations

from pathlib import Path


def registry_with_versions(state: Path, n: int = 4) -> None:
    """abpo-arm-abpo with versions 1..n in the state's SQLite MLflow store, champion v1 (real MLflow, no model files:
    promotion only reads and writes the registry)."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    cfg = load_config("tiny")
    assert cfg.paths.resolve("root") == state
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(n):
        client.create_model_version("abpo-arm-abpo", source=(state / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
