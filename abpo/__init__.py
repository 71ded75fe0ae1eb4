"""abpo: Anchored Bandit Policy Optimization for LLM recommenders, as a monthly production pipeline."""

import os as _os

__version__ = "0.1.0"

# The user's MLFLOW_TRACKING_URI, read once when abpo is first imported, before anything in this process can set it:
# mlflow.set_tracking_uri writes that variable itself (so that subprocesses inherit it), so reading it later would read
# abpo's own last choice, not the user's. abpo.config applies it (precedence: see abpo.config.tracking_uri_source) and
# abpo.registry.configure puts the variable back to this value after every set_tracking_uri.
USER_MLFLOW_TRACKING_URI = _os.environ.get("MLFLOW_TRACKING_URI", "")
USER_MLFLOW_REGISTRY_URI = _os.environ.get("MLFLOW_REGISTRY_URI", "")
