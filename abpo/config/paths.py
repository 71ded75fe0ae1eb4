"""Config section `paths`: where the state lives (the state directory, landing zone, warehouse, models, reports and
the MLflow store)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from abpo.data.storage import is_uri
from abpo.paths import base_dir


@dataclass
class PathsConfig:
    """Where the embedded defaults keep their state. Relative paths are relative to ``root``."""

    root: str = field(
        default="var",
        metadata={
            "help": "State directory; relative to the repo root unless absolute "
            "(installed from a wheel: to the current directory)."
        },
    )
    landing: str = field(
        default="landing",
        metadata={
            "help": "Landing zone: impressions/month=YYYY-MM/*.parquet (and interactions/...): a directory, or an "
            "object-store URI (s3://bucket/prefix, gs://..., any fsspec URI; credentials from the environment, "
            "never this file; a partition there is read once its $ABPO_LANDING_MARKER, default _SUCCESS, is "
            "there; docs/scaling.md)."
        },
    )
    warehouse: str = field(default="warehouse.duckdb", metadata={"help": "DuckDB warehouse file."})
    models: str = field(
        default="models", metadata={"help": "Local model checkpoints (tokenizer, tiny model, SFT, updates)."}
    )
    reports: str = field(default="reports", metadata={"help": "A/B reports (HTML, Markdown, PNG)."})
    mlflow_tracking_uri: str = field(
        default="",
        metadata={
            "help": "MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set, else SQLite file "
            "mlflow.db under root (precedence: --set > $ABPO_TRACKING_URI > $MLFLOW_TRACKING_URI > "
            "YAML > that default)."
        },
    )
    mlflow_artifacts: str = field(
        default="mlartifacts",
        metadata={
            "help": "MLflow artifact root for the SQLite store: a directory, or an object-store URI (s3://bucket/prefix; "
            "MLflow writes through boto3 with the AWS_* variables and $MLFLOW_S3_ENDPOINT_URL or "
            "$AWS_ENDPOINT_URL)."
        },
    )
    namespace: str = field(
        default="",
        metadata={
            "help": "Environment prefix of every MLflow name abpo makes: registered models "
            "(<namespace>-abpo-arm-<arm>, <namespace>-abpo-recommender), promotion locks "
            "(<namespace>-abpo-lock-<arm>) and experiments (<namespace>-abpo-arms, ...), so two "
            "environments share one MLflow server; empty = the names as they are ($ABPO_NAMESPACE)."
        },
    )

    # the fields that may name an object store (s3://bucket/prefix, gs://..., any fsspec URI: abpo.data.storage)
    URI_FIELDS = ("landing", "mlflow_artifacts")

    def resolve(self, name: str) -> Path:
        """Absolute path of one of the fields above. A field set to an object-store URI is refused here (a
        ValueError naming the key: it has no local path; :meth:`location` gives it), so no URI ever becomes a local
        directory named ``s3:``."""
        value = str(getattr(self, name))
        if is_uri(value):
            allowed = name in self.URI_FIELDS
            raise ValueError(
                f"config paths.{name} = {value!r}: "
                + (
                    "an object-store URI where a local path is needed (read it through PathsConfig.location)"
                    if allowed
                    else f"rule: a local path (only paths.{' and paths.'.join(self.URI_FIELDS)} may be object-store "
                    "URIs; the DuckDB warehouse, models and reports are files on the machine that runs the step)"
                )
            )
        root = Path(self.root)
        if not root.is_absolute():
            root = base_dir() / root
        if name == "root":
            return root
        p = Path(getattr(self, name))
        return p if p.is_absolute() else root / p

    def location(self, name: str) -> Path | str:
        """:meth:`resolve`, except that a field of :data:`URI_FIELDS` set to an object-store URI (``s3://bucket/x``,
        ``gs://...``) is returned as that URI, unchanged (abpo.data.storage reads and writes it)."""
        value = str(getattr(self, name))
        if name in self.URI_FIELDS and is_uri(value):
            return value
        return self.resolve(name)

    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.resolve('root') / 'mlflow.db'}"

    def tracking_uri_source(self) -> str:
        """Where :meth:`tracking_uri` came from (printed with it): ``--set paths.mlflow_tracking_uri``,
        ``$ABPO_TRACKING_URI``, ``$MLFLOW_TRACKING_URI``, ``<file> paths.mlflow_tracking_uri`` or the default."""
        if not self.mlflow_tracking_uri:
            return "the default: SQLite mlflow.db under paths.root"
        return getattr(self, "_tracking_uri_from", "paths.mlflow_tracking_uri")


# Environment variables a deployment sets instead of editing YAML (precedence: YAML < env < --set).
