"""Dataset loaders: a directory on disk -> item catalog + chronological per-user sequences.

- MovieLens format (ratings.csv + movies.csv, any directory in that format; CRLF or LF line ends):
  every rating is an interaction; a user's sequence is ordered by timestamp. Ratings of one user in the same
  second are in unknown order: they are put in a seeded shuffle (``tie_order_keys``, data.tie_seed), not by
  item_id, whose order would leak the next item to a sequential model.
- Amazon-2018 5-core as processed by MiniOneRec (index/<Domain>.item.json for titles, valid/ and
  test/ CSVs whose rows are (last <= 10 items, next item) windows): sequences are rebuilt by chaining
  the windows of each user (see ``_chain_windows``); how many windows chained, were already covered
  or left a gap is kept in ``Dataset.notes``. The export has no timestamps, so its order (fixed by MiniOneRec's
  preprocessing) is kept as it is: same-time ties cannot be told apart there.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from abpo.data.schemas import CATALOG_SCHEMA, INTERACTIONS_SCHEMA
from abpo.errors import ExpectedError

# The dataset formats load_dataset reads (config data.format, whose choices these are)
FORMATS = ("movielens", "amazon18")
# The markup of the policy's answer format (abpo.policy.prompt.ANSWER_MARKUP: <item_id>ID</item_id><item>TITLE</item>).
# A title holding one cannot be answered: its own well-formed answer parses as another answer plus trailing text, so
# the item would be served and logged but never rewarded. Such a title is refused at load (escaping it would change
# every prompt and the answers the registered models were trained to copy).
ANSWER_MARKUP = ("<item_id>", "</item_id>", "<item>", "</item>")


class DataFormatError(ExpectedError, ValueError):
    """Input data breaks its format; the message names the file, the row and the rule."""


@dataclass
class Dataset:
    name: str
    catalog: pa.Table  # CATALOG_SCHEMA
    interactions: pa.Table  # INTERACTIONS_SCHEMA, sorted by (user_id, position)
    sequences: dict[int, list[int]]  # user_id -> chronological item ids
    notes: dict[str, int] = field(default_factory=dict)  # loader bookkeeping (counts), for reports

    def titles(self) -> dict[int, str]:
        return dict(zip(self.catalog.column("item_id").to_pylist(), self.catalog.column("title").to_pylist()))

    def popularity(self) -> dict[int, int]:
        """Interaction count per item (items never interacted with are absent)."""
        items, counts = np.unique(self.interactions.column("item_id").to_numpy(), return_counts=True)
        return dict(zip(items.tolist(), counts.tolist()))

    def item_ids(self) -> np.ndarray:
        """Catalog item ids, ascending (int64)."""
        return np.sort(self.catalog.column("item_id").to_numpy())

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}: {self.catalog.num_rows} items, {len(self.sequences)} users, "
            f"{self.interactions.num_rows} interactions)"
        )


def check_titles(catalog: pa.Table, path: Path | str) -> None:
    """DataFormatError naming the file, the first item whose title holds the answer's markup (:data:`ANSWER_MARKUP`)
    and the rule."""
    titles = catalog.column("title")
    for tag in ANSWER_MARKUP:
        hits = pc.match_substring(titles, tag)
        if pc.any(hits).as_py():
            row = int(pc.index(hits, True).as_py())
            item, title = catalog.column("item_id")[row].as_py(), titles[row].as_py()
            shown = repr(title) if len(title) <= 80 else f"{title[:40]!r}... ({len(title)} characters)"
            raise DataFormatError(
                f"{path}: item {item}: title {shown} holds the answer's markup {tag!r}; rule: no title holds "
                f"{', '.join(ANSWER_MARKUP)} (its answer <item_id>ID</item_id><item>TITLE</item> would not parse)"
            )


def _require_columns(table: pa.Table, needed: list[str], path: Path | str) -> None:
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {missing}; found {table.column_names}")


def _first_null_row(table: pa.Table, columns: list[str], path: Path | str) -> None:
    for c in columns:
        col = table.column(c)
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            # +2: the header is line 1 and rows are 0-based
            raise DataFormatError(f"{path}: line {row + 2}, field {c!r}: empty or not a number (rule: required)")


def _read_csv(path: Path | str, types: dict[str, pa.DataType]) -> pa.Table:
    source = path
    if isinstance(path, str):  # an object (s3://bucket/dataset/ratings.csv): abpo.data.storage
        from abpo.data import storage

        if not storage.exists(path):
            raise DataFormatError(f"{path}: file not found")
        source = storage.open_input(path)
    elif not path.is_file():
        raise DataFormatError(f"{path}: file not found")
    try:
        return pacsv.read_csv(
            source,
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
        )
    except pa.ArrowInvalid as e:
        raise DataFormatError(f"{path}: cannot parse as CSV with columns {list(types)}: {e}") from e


def _sequences_from_sorted(users: np.ndarray, items: np.ndarray) -> dict[int, list[int]]:
    """users/items sorted by user then chronological position -> {user: [items]}."""
    if len(users) == 0:
        return {}
    bounds = np.flatnonzero(np.diff(users)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(users)]])
    items_list = items.tolist()
    return {int(users[s]): items_list[s:e] for s, e in zip(starts, ends)}


def _positions(users: np.ndarray) -> np.ndarray:
    """0-based index of each row inside its user's run (users sorted)."""
    idx = np.arange(len(users))
    starts = np.concatenate([[0], np.flatnonzero(np.diff(users)) + 1]) if len(users) else np.array([], int)
    run_start = np.repeat(starts, np.diff(np.concatenate([starts, [len(users)]])))
    return (idx - run_start).astype(np.int32)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): a well-mixed 64-bit hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def tie_order_keys(seed: int, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """A pseudo-random uint64 key per (seed, user, item): sorting a user's same-second ratings by it is a seeded
    shuffle that depends on nothing else (not on the file's row order, nor on other users' ratings)."""
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(len(users), np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)))
        h = _splitmix64(h ^ np.asarray(users, dtype=np.int64).astype(np.uint64))
        return _splitmix64(h ^ np.asarray(items, dtype=np.int64).astype(np.uint64))


def load_movielens(directory: str | os.PathLike, *, tie_seed: int = 0) -> Dataset:
    """Load a MovieLens-format directory (ratings.csv, movies.csv). A user's ratings in the same second are
    ordered by a seeded shuffle (``tie_order_keys(tie_seed, user, item)``)."""
    from abpo.data import storage

    movies_path: Path | str
    ratings_path: Path | str
    if storage.is_uri(directory):  # a dataset in object storage: the same two files, read through pyarrow's fs
        uri = str(directory)
        movies_path, ratings_path = storage.join(uri, "movies.csv"), storage.join(uri, "ratings.csv")
        name = storage.basename(uri)
    else:
        local = Path(directory)
        movies_path, ratings_path = local / "movies.csv", local / "ratings.csv"
        name = local.name
    movies = _read_csv(movies_path, {"movieId": pa.int64(), "title": pa.string(), "genres": pa.string()})
    _require_columns(movies, ["movieId", "title", "genres"], movies_path)
    _first_null_row(movies, ["movieId"], movies_path)
    ratings = _read_csv(
        ratings_path,
        {"userId": pa.int64(), "movieId": pa.int64(), "rating": pa.float32(), "timestamp": pa.int64()},
    )
    _require_columns(ratings, ["userId", "movieId", "rating", "timestamp"], ratings_path)
    _first_null_row(ratings, ["userId", "movieId", "timestamp"], ratings_path)

    item_ids = movies.column("movieId").to_numpy()
    uniq, counts = np.unique(item_ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        raise DataFormatError(f"{movies_path}: movieId {dup} appears more than once (rule: unique item_id)")
    genres = [[] if g in ("", "(no genres listed)") else g.split("|") for g in movies.column("genres").to_pylist()]
    order = np.argsort(item_ids, kind="stable")
    catalog = pa.table(
        {
            "item_id": pa.array(item_ids[order], pa.int64()),
            "title": pc.take(movies.column("title"), pa.array(order)).combine_chunks(),
            "genres": pa.array([genres[i] for i in order], pa.list_(pa.string())),
        },
        schema=CATALOG_SCHEMA,
    )
    check_titles(catalog, movies_path)

    users = ratings.column("userId").to_numpy()
    items = ratings.column("movieId").to_numpy()
    ts = ratings.column("timestamp").to_numpy()
    unknown = ~np.isin(items, uniq)
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        raise DataFormatError(
            f"{ratings_path}: line {row + 2}, field 'movieId': {int(items[row])} is not in movies.csv "
            "(rule: every rated item is in the catalog)"
        )
    # chronological per user; equal timestamps in a seeded shuffle (their true order is unknown, and item_id
    # order would leak the next item). item, then rating, only settle hash collisions and duplicate rows, so the
    # order never depends on the file's row order.
    rating = ratings.column("rating").to_numpy(zero_copy_only=False)
    order = np.lexsort((rating, items, tie_order_keys(tie_seed, users, items), ts, users))
    users, items, ts = users[order], items[order], ts[order]
    interactions = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "item_id": pa.array(items, pa.int64()),
            "event_time": pa.array(ts * 1_000_000, pa.int64()).cast(INTERACTIONS_SCHEMA.field("event_time").type),
            "rating": pc.take(ratings.column("rating"), pa.array(order)).combine_chunks(),
            "position": pa.array(_positions(users), pa.int32()),
        },
        schema=INTERACTIONS_SCHEMA,
    )
    return Dataset(
        name=f"movielens:{name}",
        catalog=catalog,
        interactions=interactions,
        sequences=_sequences_from_sorted(users, items),
        notes={"ratings": int(len(users))},
    )


# ---------------------------------------------------------------------------------------------- amazon18

_USER_RE = re.compile(r"^A(\d+)$")


def _amazon_csv(directory: Path, split: str, domain: str) -> Path:
    matches = sorted((directory / split).glob(f"{domain}_*.csv"))
    if len(matches) != 1:
        raise DataFormatError(
            f"{directory / split}: expected exactly one {domain}_*.csv, found {[m.name for m in matches]}"
        )
    return matches[0]


def _chain_windows(windows: list[list[int]], notes: Counter) -> list[int]:
    """Rebuild one user's sequence from (history + [target]) windows in chronological row order.

    Consecutive rows overlap: row k+1's history is the last <= 10 items of row k's history + target.
    Each window is appended after its longest overlap with the tail of the sequence built so far, so
    the overlapping part is never duplicated. A window wholly inside the tail (the same row listed in
    both valid and test) adds nothing ("covered"); a window overlapping less than its full history
    ("gap") is appended after the overlap it has and counted, since items between are unknown.
    """
    seq: list[int] = []
    for w in windows:
        n_hist = len(w) - 1
        best = 0
        for k in range(min(len(w), len(seq)), 0, -1):
            if seq[-k:] == w[:k]:
                best = k
                break
        if best == len(w):
            notes["windows_covered"] += 1
            continue
        if seq and best < n_hist:
            notes["windows_gap"] += 1
        elif seq:
            notes["windows_chained"] += 1
        else:
            notes["windows_first"] += 1
        seq.extend(w[best:])
    return seq


def load_amazon18(directory: str | os.PathLike, domain: str) -> Dataset:
    """Load one domain of the Amazon-2018 MiniOneRec export (index/<domain>.item.json + valid/ + test/)."""
    directory = Path(directory)
    item_path = directory / "index" / f"{domain}.item.json"
    if not item_path.is_file():
        raise DataFormatError(f"{item_path}: file not found (domain {domain!r})")
    try:
        raw = json.loads(item_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{item_path}: not valid JSON: {e}") from e
    ids, titles, genres = [], [], []
    for key in sorted(raw, key=int):
        rec = raw[key]
        title = rec.get("title") if isinstance(rec, dict) else None
        if not title:
            raise DataFormatError(f"{item_path}: item {key}: missing title (rule: every item has a title)")
        cats = rec.get("categories") or ""
        ids.append(int(key))
        titles.append(str(title))
        genres.append([c.strip() for c in cats.split(",") if c.strip()] if isinstance(cats, str) else list(cats))
    catalog = pa.table({"item_id": ids, "title": titles, "genres": genres}, schema=CATALOG_SCHEMA)
    check_titles(catalog, item_path)
    known = set(ids)

    windows: dict[int, list[list[int]]] = {}
    notes: Counter = Counter()
    for split in ("valid", "test"):  # valid precedes test in time (MiniOneRec splits chronologically)
        path = _amazon_csv(directory, split, domain)
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            need = {"user_id", "history_item_id", "item_id"}
            if not need <= set(reader.fieldnames or []):
                raise DataFormatError(f"{path}: missing column(s) {sorted(need - set(reader.fieldnames or []))}")
            for line, row in enumerate(reader, start=2):
                m = _USER_RE.match(row["user_id"] or "")
                if not m:
                    raise DataFormatError(f"{path}: line {line}, field 'user_id': {row['user_id']!r} is not A<digits>")
                try:
                    hist = [int(x) for x in ast.literal_eval(row["history_item_id"])]
                    target = int(row["item_id"])
                except (ValueError, SyntaxError, TypeError) as e:
                    raise DataFormatError(
                        f"{path}: line {line}, field 'history_item_id'/'item_id': not a list of ints / an int ({e})"
                    ) from e
                for it in [*hist, target]:
                    if it not in known:
                        raise DataFormatError(
                            f"{path}: line {line}: item {it} is not in {item_path.name} (rule: items are in the catalog)"
                        )
                windows.setdefault(int(m.group(1)), []).append([*hist, target])
                notes[f"rows_{split}"] += 1

    sequences = {u: _chain_windows(windows[u], notes) for u in sorted(windows)}
    users = np.fromiter((u for u, s in sequences.items() for _ in s), dtype=np.int64)
    items = np.fromiter((i for s in sequences.values() for i in s), dtype=np.int64)
    interactions = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "item_id": pa.array(items, pa.int64()),
            "event_time": pa.nulls(len(users), INTERACTIONS_SCHEMA.field("event_time").type),
            "rating": pa.nulls(len(users), pa.float32()),
            "position": pa.array(_positions(users), pa.int32()),
        },
        schema=INTERACTIONS_SCHEMA,
    )
    return Dataset(
        name=f"amazon18:{domain}", catalog=catalog, interactions=interactions, sequences=sequences, notes=dict(notes)
    )


def resolve_dataset_dir(dataset_dir: str | os.PathLike) -> Path | str:
    """The dataset directory: an object-store URI as it is (s3://bucket/movielens, movielens format only), else
    abpo.paths.repo_path."""
    from abpo.data import storage
    from abpo.paths import repo_path

    if storage.is_uri(dataset_dir):
        return str(dataset_dir)
    return repo_path(dataset_dir)


def load_dataset(data_cfg) -> Dataset:
    """Dispatch on ``data_cfg.format`` (movielens | amazon18); a relative path resolves as abpo.paths.repo_path says."""
    directory = resolve_dataset_dir(data_cfg.dataset_dir)
    if data_cfg.format == "movielens":
        return load_movielens(directory, tie_seed=data_cfg.tie_seed)
    if data_cfg.format == "amazon18":
        if isinstance(directory, str):
            raise ValueError(
                f"data.dataset_dir {directory!r}: rule: an object-store dataset is in the movielens "
                "format (amazon18 is read from a local directory)"
            )
        return load_amazon18(directory, data_cfg.amazon_domain)
    raise ValueError(f"data.format {data_cfg.format!r}: expected {' or '.join(FORMATS)}")
