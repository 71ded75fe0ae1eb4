"""The log contract: Arrow schemas of the item catalog, the interactions and the impressions log,
and the writer of the impressions landing zone (Parquet, one folder per month).

Impressions are one row per exposed recommendation (docs/ABPO_SPEC.md, D_bandit): the request's history
and candidate set C, the exposed item a_log, its logging propensity e0(a_log | q) over C, and the
feedback y = clicked. The columns after ``clicked`` are what a real serving log also needs
(see IMPRESSION_COLUMN_DOCS for the why of each); the warehouse enforces the contract
(abpo/warehouse.py) and quarantines rows that break it.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from abpo.months import parse_month

SCHEMA_VERSION = 1
TS = pa.timestamp("us", tz="UTC")

CATALOG_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("genres", pa.list_(pa.string()), nullable=False),
    ]
)

INTERACTIONS_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        # Null when the source only gives the order (amazon18 CSVs carry no timestamps).
        pa.field("event_time", TS, nullable=True),
        pa.field("rating", pa.float32(), nullable=True),
        # 0-based chronological index inside the user's sequence (the tie-break made explicit).
        pa.field("position", pa.int32(), nullable=False),
    ]
)

# The contract's quarantine rules, in the priority order of sql/ingest_check.sql (a row that breaks several is
# counted under the first).
RULES = (
    "null_field",
    "empty_field",
    "malformed_id",
    "unknown_schema_version",
    "unknown_arm",
    "unknown_model_version",
    "propensity_out_of_range",
    "clicked_not_binary",
    "item_not_in_candidates",
    "logged_item_not_once",
    "duplicate_candidates",
    "propensity_inconsistent",
    "item_not_in_catalog",
    "negative_field",
    "unknown_logging_policy",
    "logging_tau_mismatch",
    "event_time_outside_month",
    "served_at_out_of_range",
    "conflicting_impression_id",
    "duplicate_impression_id",
)

# propensity_inconsistent: a row whose propensity no exact softmax over its candidates can give. The logging rules
# (softmax(tau=X) over an LLM's mean token log-probs in (-inf, 0]; softmax(score/T) over a ranker's scores, ALS dot
# products unbounded) put no finite bound on the score gap, so for M >= 2 unique candidates every p in (0, 1] is
# reachable: p*M lies in (0, M] and nothing tighter holds for every exact propensity (a float softmax may even round
# a dominant p to 1.0). What holds exactly: M = 1 gives p = 1 (softmax over one score is exp(0)/exp(0)); a writer
# storing float32 may round, hence the tolerance. The weight a low-propensity row can carry is bounded at the gate
# instead (arms.gate_max_top_weight_share), and M is bounded by the catalog (unique candidates, item_not_in_catalog).
SINGLE_CANDIDATE_PROPENSITY_TOLERANCE = 1e-6

# The stochastic logging rules the contract knows (rule unknown_logging_policy; RE2 and Python syntax alike): what the LLM
# arms and abpo.policy.bandit write, softmax(tau=X), and what the ranker arms write, softmax(score/T, T=X) <ranker>.
# Group 1 is the temperature X, which must also be > 0 (checked as a number, so 0.0 and 0e5 are refused).
LOGGING_POLICY_PATTERN = (
    r"softmax\((?:tau|score/T, T)=([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\)"
    r"(?: [a-z][a-z0-9_]*)?"
)

# What an id (impression_id, request_id, model_version) may not hold (rule malformed_id; RE2 syntax): C0 controls and
# DEL, the C1 controls, and the bidirectional formatting characters, which make a printed line say something else
ID_FORBIDDEN_PATTERN = r"[\x{0}-\x{1f}\x{7f}-\x{9f}\x{200e}\x{200f}\x{202a}-\x{202e}\x{2066}-\x{2069}\x{061c}]"
MAX_ID_LENGTH = 256  # characters: an id far longer (a megabyte) is not an id, and bloats every report and log line

IMPRESSIONS_SCHEMA = pa.schema(
    [
        # core contract
        pa.field("impression_id", pa.string(), nullable=False),
        pa.field("event_time", TS, nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("arm", pa.string(), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),
        pa.field("history", pa.list_(pa.int64()), nullable=False),
        pa.field("candidates", pa.list_(pa.int64()), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("propensity", pa.float64(), nullable=False),
        pa.field("clicked", pa.int8(), nullable=False),
        # serving columns a real log also needs
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("position", pa.int16(), nullable=False),
        pa.field("logging_policy", pa.string(), nullable=False),
        pa.field("served_at", TS, nullable=False),
        pa.field("schema_version", pa.int16(), nullable=False),
    ]
)

IMPRESSION_COLUMN_DOCS: dict[str, str] = {
    "impression_id": "Unique id of the exposure; the warehouse's primary key (duplicates are quarantined).",
    "event_time": "When the item was shown (UTC); decides the month partition.",
    "user_id": "Who saw it; the A/B assignment is a stable hash of it.",
    "arm": "A/B arm that served the request (abpo, grpo, ml_retrain, popularity).",
    "model_version": "MLflow model version that produced the exposure (lineage): for an arm abpo serves, once its "
    "registered model has versions, one of them (else quarantined at ingest: unknown_model_version).",
    "history": "Item ids of the prompt's history x_{1:t'}, chronological.",
    "candidates": "Candidate set C_{t'} the policy chose from, in the order shown to the model.",
    "item_id": "The exposed item a_log; must be one of `candidates`.",
    "propensity": "e0(a_log | q): the logging probability of the exposed item over C, 0 < p <= 1.",
    "clicked": "Feedback y: 1 = click, 0 = no response (not a negative label).",
    "request_id": "One per served request: ties the exposure to the serving trace and to retries; several "
    "impressions of one slate share it.",
    "position": "Slot of the item in what the user saw (0 = first); needed to model position bias once "
    "slates have more than one slot.",
    "logging_policy": "How a_log was drawn (e.g. softmax(tau=1.0), argmax, uniform): off-policy estimates "
    "such as SNIPS are only valid when the logging rule was stochastic, and two arms may share a "
    "model_version but sample differently.",
    "served_at": "Server clock when the response left the model (event_time is the client's view); "
    "the gap is serving latency and flags clock skew or replays.",
    "schema_version": f"Version of this contract the writer followed (now {SCHEMA_VERSION}), so the "
    "warehouse can migrate old partitions instead of misreading them.",
}

# Every impressions column is required (non-null); the warehouse quarantines rows with a null.
REQUIRED_IMPRESSION_COLUMNS = [f.name for f in IMPRESSIONS_SCHEMA]


class SchemaError(ValueError):
    """A table or file does not follow a contract schema; the message names where and what."""


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_list(expected):
        return (pa.types.is_list(found) or pa.types.is_large_list(found)) and _same_type(
            found.value_type, expected.value_type
        )
    if pa.types.is_timestamp(expected):
        return pa.types.is_timestamp(found) and found.unit == expected.unit and found.tz in ("UTC", "+00:00")
    return found.equals(expected)


def schema_problems(found: pa.Schema, expected: pa.Schema) -> list[str]:
    """Human-readable differences between a found schema and the contract (empty = conforms).
    Column order and nullability flags are not compared (the warehouse checks nulls row by row)."""
    problems = []
    names = set(found.names)
    missing = [f.name for f in expected if f.name not in names]
    if missing:
        problems.append(f"missing column(s) {missing}")
    extra = [n for n in found.names if n not in expected.names]
    if extra:
        problems.append(f"unexpected column(s) {extra}")
    for f in expected:
        if f.name in names:
            t = found.field(f.name).type
            if not _same_type(t, f.type):
                problems.append(f"column {f.name!r} has type {t}, expected {f.type}")
    return problems


def conform(table: pa.Table, schema: pa.Schema, where: str = "table") -> pa.Table:
    """Check ``table`` against ``schema`` (names and types) and return it in the schema's column order.
    Raises SchemaError naming ``where`` and every problem."""
    problems = schema_problems(table.schema, schema)
    if problems:
        raise SchemaError(f"{where}: does not follow the contract: " + "; ".join(problems))
    cols = [table.column(f.name).cast(f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=pa.schema([pa.field(f.name, f.type) for f in schema]))


def check_month(month: str, what: str = "month") -> str:
    """``month`` when it is YYYY-MM (abpo.months.parse_month, the one strict parser), else MonthError."""
    return parse_month(month, what)


def month_dir(landing_dir: str | os.PathLike, month: str, kind: str = "impressions") -> Path:
    """landing/<kind>/month=YYYY-MM (the Hive-style partition folder of one month; kind impressions or
    interactions)."""
    return Path(landing_dir) / kind / f"month={check_month(month)}"


def month_location(landing_dir: str | os.PathLike, month: str, kind: str = "impressions") -> Path | str:
    """:func:`month_dir`, or for an object-store landing zone (``s3://bucket/landing``, abpo.data.storage) the URI
    ``s3://bucket/landing/<kind>/month=YYYY-MM``."""
    from abpo.data import storage

    if storage.is_uri(landing_dir):
        return month_uri(str(landing_dir), month, kind)
    return month_dir(landing_dir, month, kind)


def month_uri(landing_uri: str, month: str, kind: str = "impressions") -> str:
    """:func:`month_location` of an object-store landing zone: ``<landing_uri>/<kind>/month=YYYY-MM``."""
    from abpo.data import storage

    return storage.join(landing_uri, kind, f"month={check_month(month)}")


# Row groups of this many rows: a reader (DuckDB's ingest) decodes a file's row groups in parallel, so one huge group
# would be read on one core.
LANDING_ROW_GROUP_ROWS = 131_072


def write_impressions(
    table: pa.Table, landing_dir: str | os.PathLike, month: str, *, part: str | None = None
) -> Path | str:
    """Write an impressions table into the landing zone: landing/impressions/month=YYYY-MM/part-*.parquet.

    The table must follow IMPRESSIONS_SCHEMA by name and type (checked here; row-level rules such as
    propensity range are the warehouse's job, so a producer can land what it really served).
    ``part`` names the file (``part-<part>.parquet``): writing the same part again replaces it, which
    makes a producer's rerun idempotent; without it a fresh unique name is used. The file is written
    to a hidden temporary name and renamed, so a reader never sees half a file.
    """
    return _write_landing(
        conform(table, IMPRESSIONS_SCHEMA, where=f"impressions for {month}"), month_location(landing_dir, month), part
    )


def write_interactions(
    table: pa.Table, landing_dir: str | os.PathLike, month: str, *, part: str | None = None
) -> Path | str:
    """Write what users consumed in ``month`` (INTERACTIONS_SCHEMA: user, item, time, position in the user's
    sequence) into landing/interactions/month=YYYY-MM/part-*.parquet, as :func:`write_impressions` does; the
    warehouse ingests it with the month (abpo.warehouse.Warehouse.ingest_interactions) and the ranker arms' refits
    read it back (interactions to date)."""
    return _write_landing(
        conform(table, INTERACTIONS_SCHEMA, where=f"interactions for {month}"),
        month_location(landing_dir, month, "interactions"),
        part,
    )


def _write_landing(table: pa.Table, out_dir: Path | str, part: str | None) -> Path | str:
    name = part if part is not None else uuid.uuid4().hex[:16]
    if not re.fullmatch(r"[A-Za-z0-9_.=-]+", name):
        raise ValueError(f"part {name!r}: use letters, digits, '_', '-', '.', '='")
    if isinstance(out_dir, str):  # an object-store partition (month_location): the object, then the marker
        from abpo.data import storage

        uri = storage.join(out_dir, f"part-{name}.parquet")
        storage.write_parquet(table, uri, compression="zstd", row_group_size=LANDING_ROW_GROUP_ROWS)
        if storage.landing_marker():
            storage.touch(storage.join(out_dir, storage.landing_marker()))
        return uri
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"part-{name}.parquet"
    tmp = out_dir / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=LANDING_ROW_GROUP_ROWS)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
