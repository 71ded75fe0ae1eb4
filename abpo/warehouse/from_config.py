"""The warehouse as the config describes it: its path, memory limit and spill directory (:func:`open_warehouse`),
and the ingest with every contract and audit setting of section data (:func:`ingest_with_config`); a synthetic month
landed over the config's catalog to try it on (:func:`land_synthetic`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from abpo.data.loaders import load_dataset
from abpo.validation import ValidationSummary, save_summary, validate_month
from abpo.warehouse.core import Warehouse
from abpo.warehouse.errors import WarehouseLost, check_memory_limit
from abpo.warehouse.ingest import IngestReport

if TYPE_CHECKING:
    from abpo.config import Config

MEMORY_LIMIT_ENV = "ABPO_WAREHOUSE_MEMORY_LIMIT"  # a deployment's cap (docker-compose.yml sets it), over the config


def warehouse_memory_limit(cfg: Config) -> str:
    """$ABPO_WAREHOUSE_MEMORY_LIMIT when set, else data.warehouse_memory_limit; checked against the size grammar."""
    env = os.environ.get(MEMORY_LIMIT_ENV, "")
    if env:
        return check_memory_limit(env, f"${MEMORY_LIMIT_ENV}")
    return check_memory_limit(cfg.data.warehouse_memory_limit)


# a cycle record's name: <YYYY-MM>.json (the month completed), <YYYY-MM>.ingest.json, <YYYY-MM>.<arm>.<step>.json
_RECORD = re.compile(r"(\d{4}-\d{2})(?:\..+)?")


def recorded_months(cfg: Config) -> list[str]:
    """The months the state's cycle records name (``<paths.root>/cycle/<YYYY-MM>[.<...>].json``: a month completed,
    ingested, or an arm's step of it recorded), oldest first: months whose rows the warehouse holds."""
    d = cfg.paths.resolve("root") / "cycle"
    if not d.is_dir():
        return []
    return sorted({m.group(1) for p in d.glob("*.json") if (m := _RECORD.fullmatch(p.stem))})


def require_warehouse(cfg: Config, registry_months: Iterable[str] = ()) -> None:
    """Refuse a warehouse that is missing or empty (0 bytes) while months are recorded: by the state's cycle records
    (:func:`recorded_months`) or, given as ``registry_months``, by its registry (the months its champions were trained
    on). Creating it again would give a new, empty warehouse, the recorded months' impressions and their place in the
    report gone without a word. WarehouseLost names the file, the months and the rule. Checked before anything opens
    the file for writing (which would create it)."""
    path = cfg.paths.resolve("warehouse")
    if path.is_file() and path.stat().st_size > 0:
        return
    cycle = recorded_months(cfg)
    months = sorted(set(cycle) | {str(m) for m in registry_months if m})
    if not months:
        return
    state = "missing" if not path.exists() else "empty (0 bytes)" if path.is_file() else "not a regular file"
    where = " and ".join(
        w
        for w, given in (
            (f"the cycle records under {path.parent / 'cycle'}", cycle),
            ("the registry's champions' training months", set(months) - set(cycle)),
        )
        if given
    )
    raise WarehouseLost(
        f"{path}: the warehouse is {state}, but {len(months)} month(s) recorded ({months[0]}..{months[-1]}) "
        f"by {where}; rule: warehouse_matches_state: a state with recorded months keeps their warehouse, never "
        "silently recreated empty; restore the file (from a backup), or start a fresh state (another paths.root / "
        "$ABPO_STATE)"
    )


def open_warehouse(cfg: Config, *, read_only: bool = False) -> Warehouse:
    """The config's warehouse (paths.warehouse) with its memory limit (:func:`warehouse_memory_limit`) and spill
    directory (section data). A writer is refused a warehouse lost by a state with recorded months
    (:func:`require_warehouse`) before the file is created."""
    if not read_only:
        require_warehouse(cfg)
    tmp = cfg.data.warehouse_temp_directory
    if tmp and not Path(tmp).is_absolute():
        tmp = str(cfg.paths.resolve("root") / tmp)
    return Warehouse(
        cfg.paths.resolve("warehouse"),
        read_only=read_only,
        memory_limit=warehouse_memory_limit(cfg),
        temp_directory=tmp,
    )


def ingest_with_config(
    cfg: Config,
    month: str,
    *,
    landing: str | os.PathLike | None = None,
    force: bool = False,
    validate: bool = True,
    model_versions: Mapping[str, tuple[str, Iterable[str]]] | None = None,
) -> tuple[IngestReport, Path]:
    """Write, audit, publish ``month`` with every contract and audit setting of the config's ``data`` section (the one
    place they are read, for `abpo ingest` and the pipeline alike): known arms, min_propensity, max_clock_skew_seconds,
    ingest_min_keep_fraction, max_quarantine_fraction, the catalog (the dataset's item ids: item_not_in_catalog), and
    the Great Expectations suite unless ``validate`` is false. The suite's summary
    (``validation/impressions_<month>.json``) is written only once the month is published: a refused ingest leaves
    the month's summary as it was. ``model_versions``: the registered versions of the arms abpo serves, which a row's
    model_version must name (rule unknown_model_version; abpo.arms.versions.registered_versions reads them, the
    callers above the registry pass them); None: not checked. Returns the report and the warehouse's path."""

    d = cfg.data
    out_dir = cfg.paths.resolve("root") / "validation"
    audit = (
        (
            lambda w, m: validate_month(
                w,
                m,
                d.known_arms,
                out_dir=out_dir,
                staged=True,
                min_propensity=d.min_propensity,
                max_clock_skew_seconds=d.max_clock_skew_seconds,
            )
        )
        if validate
        else None
    )
    catalog = config_catalog(cfg)
    with open_warehouse(cfg) as wh:
        report = wh.ingest_month(
            landing or cfg.paths.location("landing"),
            month,
            d.known_arms,
            force=force,
            min_keep_fraction=d.ingest_min_keep_fraction,
            audit=audit,
            min_propensity=d.min_propensity,
            max_clock_skew_seconds=d.max_clock_skew_seconds,
            max_quarantine_fraction=d.max_quarantine_fraction,
            catalog=catalog,
            policy_tau=cfg.policy.tau,  # the tau the update recomputes e_old with (rule logging_tau_mismatch)
            model_versions=model_versions,
        )
    if isinstance(report.audit, ValidationSummary):  # the suite ran (validate): its summary, once published
        save_summary(report.audit, out_dir)
    return report, wh.path


def land_synthetic(cfg: Config, month: str, n: int, violation_rate: float, landing: str | None = None):
    """``abpo data synth``: ``n`` synthetic impressions for ``month`` (abpo.data.synthetic: random users and items of
    the config's catalog, arms data.known_arms, seed data.seed, a share ``violation_rate`` of rows breaking one rule of
    the contract) landed as part-synthetic.parquet in ``landing`` (default paths.landing), for trying the ingest.
    Returns (the rows written, where, the violations injected per rule)."""
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions

    where = landing or cfg.paths.location("landing")
    catalog = config_catalog(cfg)  # the ingest checks the items against it (item_not_in_catalog)
    table, injected = synthetic_impressions(
        n,
        month,
        seed=cfg.data.seed,
        arms=tuple(cfg.data.known_arms),
        violation_rate=violation_rate,
        item_ids=catalog,
        n_items=min(5_000, len(catalog)),
    )
    path = write_impressions(table, where, month, part="synthetic")
    return table.num_rows, path, injected


def config_catalog(cfg: Config) -> list[int]:
    """The item ids of the config's dataset (section data): the catalog impressions and interactions are checked
    against at ingest (item_not_in_catalog)."""

    return [int(i) for i in load_dataset(cfg.data).item_ids()]
