"""The series a state runs: the data settings that decide the users and their positions (the split of
abpo.data.splits), recorded in ``<state>/series.json`` by the first bootstrap, and checked by every later one.

A month's windows are positions of each user's update segment (abpo.sim.simulator: month i covers window i mod n),
so a setting that changes the split (``data.update_steps`` moves T = len - update_steps - 1, ``data.max_users`` or
``data.seed`` picks other users, ...) would make the next month serve and train on another series than the months
already in the warehouse, and the lineage and reports would mix the two. Once the warehouse holds a month, such a
setting is refused (:class:`SeriesChanged`, a ValueError: the DAG fails the task without retry), naming each key, its
recorded value and the value asked for. A state with no month in its warehouse yet takes the new settings (recorded
again). A state made before this record existed adopts the settings of its next month's bootstrap."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)

# the data.* keys abpo.data.loaders.load_dataset and abpo.data.splits.split_users read: which dataset, which users
# (max_users drawn with seed), and where each user's history ends (min_history, update_steps; the candidate sizes
# decide which users have enough unseen items)
SPLIT_KEYS = (
    "dataset_dir",
    "format",
    "amazon_domain",
    "tie_seed",
    "seed",
    "max_users",
    "min_history",
    "update_steps",
    "train_candidates",
    "eval_candidates",
)


class SeriesChanged(ExpectedError, ValueError):
    """A setting that changes the data split of a series whose months are already in the warehouse."""


def series_file(cfg: Config) -> Path:
    return cfg.paths.resolve("root") / "series.json"


def split_settings(cfg: Config) -> dict[str, Any]:
    """The config's values of :data:`SPLIT_KEYS`, keyed ``data.<key>``."""
    d = dataclasses.asdict(cfg.data)
    return {f"data.{k}": d[k] for k in SPLIT_KEYS}


def _months_in_warehouse(cfg: Config) -> list[str]:
    from abpo.warehouse import open_warehouse

    if not cfg.paths.resolve("warehouse").exists():
        return []
    with open_warehouse(cfg, read_only=True) as wh:
        return list(wh.months())


def check_series(cfg: Config, month: str) -> dict[str, Any]:
    """Refuse ``month`` (:class:`SeriesChanged`) when the config's split settings differ from those recorded in
    ``series.json`` and the warehouse holds a month; else record them (first run, or no month ingested yet) and
    return them."""
    path = series_file(cfg)
    now = split_settings(cfg)
    recorded: dict[str, Any] | None = None
    if path.exists():
        try:
            recorded = json.loads(path.read_text())["settings"]
        except (ValueError, KeyError, TypeError) as e:
            raise SeriesChanged(
                f"{path}: not a series record ({e}); rule: JSON with 'settings' (restore it from the "
                "state's backup, or delete it to record the current settings)"
            ) from e
    if recorded == now:
        return now
    if recorded is not None:
        months = _months_in_warehouse(cfg)
        changed = {k: (recorded.get(k), v) for k, v in now.items() if recorded.get(k) != v}
        if months:
            keys = ", ".join(f"{k} = {v!r} (recorded {old!r})" for k, (old, v) in changed.items())
            raise SeriesChanged(
                f"month {month}: {keys}: rule: the data split of a series is fixed once its warehouse holds a month "
                f"(here {months[0]}..{months[-1]}; recorded in {path}); the setting is refused, not applied. Run "
                "the months beyond the simulator's windows as they are (they wrap around, docs/operations.md "
                '"Months beyond the demo"), or start a new series in a new state (ABPO_STATE)'
            )
        log.info(f"series: no month in the warehouse yet; the split settings change ({sorted(changed)}) is recorded")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": now, "first_month": str(month)}, indent=1, sort_keys=True))
    tmp.replace(path)
    return now
