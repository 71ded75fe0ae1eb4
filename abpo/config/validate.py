"""The rules that relate config keys, checked once by :func:`validate` when :func:`abpo.config.load_config` has
applied the preset, the environment and every override: a combination that cannot run is refused before any step
starts, with one line naming each key involved and the rule (a ConfigError). A rule about one field alone is that
field's metadata (abpo.config.values)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from abpo.config.errors import ConfigError
from abpo.data.storage import is_uri
from abpo.paths import namespaced
from abpo.redact import has_userinfo, redact

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.config.experiment import ExperimentConfig


# the config's object-store URIs: read through abpo.data.storage with credentials from the environment only
CREDENTIAL_FREE_FIELDS = ("paths.landing", "paths.mlflow_artifacts", "data.dataset_dir")


def check_no_credentials(cfg: Config) -> None:
    """ConfigError for an object-store URI setting (:data:`CREDENTIAL_FREE_FIELDS`) that carries credentials
    (``s3://KEY:SECRET@bucket/x``, ``?secret_key=...``): credentials never come from the config, which is copied,
    committed and printed (`abpo config`); they come from the environment or $ABPO_STORAGE_CONNECTION."""
    for dotted in CREDENTIAL_FREE_FIELDS:
        section, key = dotted.split(".")
        value = str(getattr(getattr(cfg, section), key, "") or "")
        if is_uri(value) and has_userinfo(value):
            raise ConfigError(
                f"config {dotted} = {redact(value)!r}: rule: credentials never come from the config (no "
                "user:password@ or secret query parameter in an object-store URI); set AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance role, or $ABPO_STORAGE_CONNECTION "
                "(docs/scaling.md)"
            )


def check_rounds_fit(e: ExperimentConfig, data_update_steps: int) -> None:
    """The experiment's R rounds split each user's update positions into R windows (abpo.experiment.seeds
    .round_positions), so R may not exceed them: ``experiment.update_steps`` when set, else ``data.update_steps``.
    A ConfigError naming both keys and the rule otherwise (:func:`validate` at load, and the experiment's config,
    abpo.experiment.rows.experiment_config, once it applied ``experiment.update_steps``)."""
    steps = e.update_steps or data_update_steps
    if e.rounds > steps:
        applied = f" (experiment.update_steps={e.update_steps} applied)" if e.update_steps else ""
        raise ConfigError(
            f"experiment.rounds={e.rounds} > data.update_steps={steps}{applied}; rule: every round needs at least one "
            "update position per user"
        )


def validate(cfg: Config) -> None:
    """Every rule that relates config keys, checked once, when :func:`abpo.config.load_config` has applied the preset,
    the environment and every override: a combination that cannot run is refused before any step starts, with one
    line naming each key involved and the rule (a ConfigError). The rules:

    - ``paths.namespace`` a name MLflow and Airflow names can carry (abpo.paths.namespaced);
    - no credentials in an object-store URI setting (:func:`check_no_credentials`);
    - ``experiment.rounds`` at most the update positions per user (``experiment.update_steps`` when set, else
      ``data.update_steps``): :func:`check_rounds_fit`.
    """
    try:
        namespaced("", cfg.paths.namespace)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_no_credentials(cfg)
    check_rounds_fit(cfg.experiment, cfg.data.update_steps)
