"""MLflow as the single record of models: tracking set-up, runs, and the model registry.

The embedded default is a SQLite tracking store and a local artifact root under ``var/`` (see
``PathsConfig``); any other tracking URI (an MLflow server) works the same. A policy checkpoint (a
``save_pretrained`` directory) is logged as an MLflow pyfunc model whose loader is
:mod:`abpo.serving`, registered under :data:`MODEL_NAME`, and promoted by alias
(``challenger`` on registration, ``champion`` after the gate).

Its parts: :mod:`abpo.registry.store` (the store, experiments, runs), :mod:`abpo.registry.tasks` (task keys),
:mod:`abpo.registry.models` (logging models), :mod:`abpo.registry.versions` (registered versions and aliases),
:mod:`abpo.registry.weights` (whole weights) and :mod:`abpo.registry.errors`. Every name stays importable from
``abpo.registry`` itself.
"""

from abpo.registry.errors import ModelFilesDamaged, RegistryUnavailable, StateMoved
from abpo.registry.models import (
    LLM_SERVING_PACKAGES,
    RANKER_SERVING_PACKAGES,
    TRAINING_COLUMNS,
    _artifact_root,
    _last_logged_model_id,
    abpo_code,
    discard_logged_model,
    llm_signature,
    log_dataset_input,
    log_model_dir,
    log_pyfunc,
    log_training_months,
    os_error_in,
    pinned_requirements,
    ranker_signature,
)
from abpo.registry.store import (
    CHALLENGER,
    CHAMPION,
    MODEL_NAME,
    _announced,
    _checked_moved,
    _end_locked_run,
    _ensure_experiment,
    _initialised,
    configure,
    ensure_store,
    experiment_name,
    log,
    model_name,
    moved_from,
    redact_uri,
    sqlite_path,
    start_run,
    store_line,
    store_locked,
)
from abpo.registry.tasks import (
    TASK_DONE_TAG,
    TASK_KEY_TAG,
    TASK_RESULT_ARTIFACT,
    completed_task_run,
    record_task_result,
    task_result,
)
from abpo.registry.versions import (
    LOGGED_MODEL_URI,
    download_model_dir,
    get_version,
    is_not_found,
    log_model_metrics,
    log_version_dict,
    logged_model_id,
    model_metrics,
    register,
    set_alias,
    version_dict,
)
from abpo.registry.weights import check_weights, safetensors_problem

__all__ = [
    "CHALLENGER", "CHAMPION", "LLM_SERVING_PACKAGES", "LOGGED_MODEL_URI", "MODEL_NAME", "RANKER_SERVING_PACKAGES",
    "TASK_DONE_TAG", "TASK_KEY_TAG", "TASK_RESULT_ARTIFACT", "TRAINING_COLUMNS", "ModelFilesDamaged",
    "RegistryUnavailable", "StateMoved", "_announced", "_artifact_root", "_checked_moved", "_end_locked_run",
    "_ensure_experiment", "_initialised", "_last_logged_model_id", "abpo_code", "check_weights", "completed_task_run",
    "configure", "discard_logged_model", "download_model_dir", "ensure_store", "experiment_name", "get_version",
    "is_not_found", "llm_signature", "log", "log_dataset_input", "log_model_dir", "log_model_metrics", "log_pyfunc",
    "log_training_months", "log_version_dict", "logged_model_id", "model_metrics", "model_name", "moved_from",
    "os_error_in", "pinned_requirements", "ranker_signature", "record_task_result", "redact_uri", "register",
    "safetensors_problem", "set_alias", "sqlite_path", "start_run", "store_line", "store_locked", "task_result",
    "version_dict",
]
