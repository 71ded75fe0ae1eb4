"""The registry's errors (each keeps ``abpo.registry.<name>`` as its module path: the DAG's retry table and
pickling name them so)."""

from __future__ import annotations


class StateMoved(ValueError):
    """The state's SQLite MLflow store names artifact locations under another state directory: the state was copied
    or restored elsewhere, and using it as it is would write into the old directory."""


class RegistryUnavailable(RuntimeError):
    """The MLflow registry could not answer (server down, network, database error): never read as "no alias"."""


class ModelFilesDamaged(RuntimeError):
    """A model directory's weights are not whole (a truncated or corrupt ``*.safetensors``, a file that does not
    match the checksum recorded when it was downloaded), or it could not be written (a full disk): the message names
    the file and the rule. An expected error (`abpo` prints one line)."""


for _cls in (StateMoved, RegistryUnavailable, ModelFilesDamaged):
    _cls.__module__ = "abpo.registry"
