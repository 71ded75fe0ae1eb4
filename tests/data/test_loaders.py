import os
from pathlib import Path

import numpy as np
import pytest

from abpo.data.loaders import (
    DataFormatError,
    _chain_windows,
    load_amazon18,
    load_dataset,
    load_movielens,
    tie_order_keys,
)
from abpo.data.schemas import CATALOG_SCHEMA, INTERACTIONS_SCHEMA

# read from ../shared/data next to the checkout (not vendored); ABPO_AMAZON18_DIR overrides
AMAZON = Path(os.environ.get("ABPO_AMAZON18_DIR", Path(__file__).resolve().parents[3] / "shared" / "data" / "amazon18"))
MOVIELENS_DIR = Path(__file__).resolve().parents[2] / "data" / "ml-latest-small"
needs_amazon = pytest.mark.skipif(not (AMAZON / "index").is_dir(), reason=f"{AMAZON} absent (not vendored)")


def _write_ml(d: Path, ratings: list[str], movies: list[str] | None = None, eol: str = "\r\n") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    movies = movies or ["1,A (1990),Drama", '2,"B, The (1991)",Comedy|Drama', "3,C (1992),(no genres listed)"]
    (d / "movies.csv").write_bytes(eol.join(["movieId,title,genres", *movies, ""]).encode())
    (d / "ratings.csv").write_bytes(eol.join(["userId,movieId,rating,timestamp", *ratings, ""]).encode())
    return d


def test_bundled_movielens_counts_and_schemas(movielens):
    assert movielens.interactions.num_rows == 100_836  # every rating is an interaction
    assert len(movielens.sequences) == 610 and movielens.catalog.num_rows == 9_742
    assert movielens.catalog.schema.equals(CATALOG_SCHEMA)
    assert movielens.interactions.schema.equals(INTERACTIONS_SCHEMA)
    assert sum(len(s) for s in movielens.sequences.values()) == 100_836
    titles = movielens.titles()
    assert titles[1] == "Toy Story (1995)"
    assert movielens.catalog.to_pylist()[0]["genres"] == ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    pop = movielens.popularity()
    assert sum(pop.values()) == 100_836 and pop[356] == max(pop.values())  # Forrest Gump, most rated


def test_sequences_are_chronological_with_seeded_shuffled_ties(movielens):
    t = movielens.interactions
    users = t.column("user_id").to_numpy()
    ts = t.column("event_time").cast("int64").to_numpy()
    items = t.column("item_id").to_numpy()
    same_user = users[1:] == users[:-1]
    assert (ts[1:][same_user] >= ts[:-1][same_user]).all()
    ties = same_user & (ts[1:] == ts[:-1])
    assert ties.sum() > 1000  # MovieLens has many same-second ratings: the tie order matters
    # ties follow the seeded key, not item_id: about half the tied neighbours are in ascending item order
    keys = tie_order_keys(0, users, items)
    assert (keys[1:][ties] > keys[:-1][ties]).all()
    assert 0.4 < (items[1:][ties] > items[:-1][ties]).mean() < 0.6
    assert set(movielens.sequences[1][:2]) == {804, 1210}  # user 1: 804 and 1210 share the first second
    pos = t.column("position").to_numpy()
    assert (pos[~np.concatenate([[False], same_user])] == 0).all()


def _tie_groups(ds) -> dict[tuple[int, int], list[int]]:
    """(user, second) -> items in sequence order, for seconds with more than one rating."""
    t = ds.interactions
    groups: dict[tuple[int, int], list[int]] = {}
    for u, e, i in zip(
        t.column("user_id").to_pylist(),
        t.column("event_time").cast("int64").to_pylist(),
        t.column("item_id").to_pylist(),
    ):
        groups.setdefault((u, e), []).append(i)
    return {k: v for k, v in groups.items() if len(v) > 1}


def test_tie_shuffle_is_seeded(movielens):
    again = load_movielens(MOVIELENS_DIR, tie_seed=0)
    assert again.sequences == movielens.sequences and again.interactions.equals(movielens.interactions)
    other = load_movielens(MOVIELENS_DIR, tie_seed=1)
    g0, g1 = _tie_groups(movielens), _tie_groups(other)
    assert g0.keys() == g1.keys() and len(g0) > 500
    assert all(sorted(g0[k]) == sorted(g1[k]) for k in g0)  # the same ratings in each second...
    changed = np.mean([g0[k] != g1[k] for k in g0])
    assert changed > 0.4  # ...in another order for many of them (a pair flips with probability 1/2)
    # and only the ties move: every sequence keeps its items, in the same seconds
    assert {u: sorted(s) for u, s in other.sequences.items()} == {u: sorted(s) for u, s in movielens.sequences.items()}
    ts = lambda d: d.interactions.column("event_time").to_pylist()  # noqa: E731
    assert ts(other) == ts(movielens)


def test_tie_order_ignores_row_order_and_other_users(tmp_path, movielens_dir):
    d = movielens_dir(60, 30, ratings_per_user=25, tie_share=0.5)
    base = load_movielens(d, tie_seed=7)
    assert len(_tie_groups(base)) > 100
    header, *rows = (d / "ratings.csv").read_text().splitlines()
    rng = np.random.default_rng(1)
    shuffled = _write_ml(
        tmp_path / "shuffled",
        [rows[i] for i in rng.permutation(len(rows))],
        (d / "movies.csv").read_text().splitlines()[1:],
        eol="\n",
    )
    assert load_movielens(shuffled, tie_seed=7).sequences == base.sequences
    # a user's order does not depend on the other users present
    odd = _write_ml(
        tmp_path / "odd",
        [r for r in rows if int(r.split(",")[0]) % 2],
        (d / "movies.csv").read_text().splitlines()[1:],
        eol="\n",
    )
    assert load_movielens(odd, tie_seed=7).sequences == {u: s for u, s in base.sequences.items() if u % 2}


def test_without_ties_the_order_is_chronological_whatever_the_seed(tmp_path):
    ratings = ["1,3,4.0,30", "1,1,4.0,10", "1,2,4.0,20", "2,2,1.0,5", "2,1,1.0,6", "2,3,1.0,4"]
    d = _write_ml(tmp_path / "noties", ratings)
    for seed in range(5):
        assert load_movielens(d, tie_seed=seed).sequences == {1: [1, 2, 3], 2: [3, 2, 1]}


def test_load_dataset_passes_the_tie_seed(data_cfg):
    data_cfg.tie_seed = 1
    assert load_dataset(data_cfg).sequences == load_movielens(MOVIELENS_DIR, tie_seed=1).sequences


def test_crlf_and_lf_give_the_same_dataset(tmp_path):
    ratings = ["1,2,4.5,100", "1,1,3.0,100", "1,3,5.0,50", "2,1,1.0,7"]
    a = load_movielens(_write_ml(tmp_path / "crlf", ratings, eol="\r\n"))
    b = load_movielens(_write_ml(tmp_path / "lf", ratings, eol="\n"))
    assert a.sequences == b.sequences
    # user 1: ts 50, then a tie at 100 (seeded order)
    assert a.sequences[1][0] == 3 and sorted(a.sequences[1][1:]) == [1, 2] and a.sequences[2] == [1]
    assert a.catalog.equals(b.catalog) and a.interactions.equals(b.interactions)
    assert a.titles()[2] == "B, The (1991)"  # quoted comma survives
    assert a.catalog.column("genres").to_pylist() == [["Drama"], ["Comedy", "Drama"], []]
    rating_of = {(1, 2): 4.5, (1, 1): 3.0, (1, 3): 5.0, (2, 1): 1.0}  # ratings travel with their rows
    assert a.interactions.column("rating").to_pylist() == [rating_of[1, i] for i in a.sequences[1]] + [1.0]


def test_rating_of_unknown_movie_names_file_line_and_rule(tmp_path):
    d = _write_ml(tmp_path / "bad", ["1,1,4.0,10", "1,99,4.0,11"])
    with pytest.raises(DataFormatError, match=r"ratings\.csv: line 3, field 'movieId': 99 .*catalog"):
        load_movielens(d)


def test_missing_timestamp_names_file_and_line(tmp_path):
    d = _write_ml(tmp_path / "bad", ["1,1,4.0,10", "1,2,4.0,"])
    with pytest.raises(DataFormatError, match=r"ratings\.csv: line 3, field 'timestamp'"):
        load_movielens(d)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataFormatError, match="movies.csv: file not found"):
        load_movielens(tmp_path)


def test_load_dataset_dispatches_relative_to_repo_root(data_cfg):
    data_cfg.dataset_dir = "data/ml-latest-small"
    assert len(load_dataset(data_cfg).sequences) == 610
    data_cfg.format = "parquet"
    with pytest.raises(ValueError, match="data.format 'parquet'"):
        load_dataset(data_cfg)


def test_chain_windows_dedupes_overlaps_and_counts():
    from collections import Counter

    notes = Counter()
    windows = [[5, 6], [5, 6, 7], [5, 6, 7, 7], [6, 7, 7, 8], [6, 7, 7, 8]]  # last one listed twice
    assert _chain_windows(windows, notes) == [5, 6, 7, 7, 8]  # repeats of an item are kept, overlaps not
    assert notes == {"windows_first": 1, "windows_chained": 3, "windows_covered": 1}
    notes = Counter()
    assert _chain_windows([[1, 2], [9, 3]], notes) == [1, 2, 9, 3] and notes["windows_gap"] == 1


@needs_amazon
def test_amazon18_office_products():
    ds = load_amazon18(AMAZON, "Office_Products")
    assert ds.catalog.num_rows == 3459 and ds.catalog.schema.equals(CATALOG_SCHEMA)
    assert ds.titles()[0].startswith("HP 74 Black & 75 Tri-color")
    assert ds.notes["rows_valid"] == 4866 and ds.notes["rows_test"] == 4866
    # every CSV row became exactly one first-or-chained window (the export has no gaps)
    assert ds.notes.get("windows_gap", 0) == 0
    assert ds.notes["windows_first"] == len(ds.sequences)
    assert ds.notes["windows_first"] + ds.notes["windows_chained"] + ds.notes.get("windows_covered", 0) == 9732
    # user A1228 (valid rows then test rows): the full chain, overlapping history not duplicated
    assert ds.sequences[1228] == [926, 38, 206, 598, 43, 341, 355, 207, 1184, 345, 2486, 1736, 1478]
    assert ds.interactions.num_rows == sum(len(s) for s in ds.sequences.values())
    assert ds.interactions.column("event_time").null_count == ds.interactions.num_rows


@needs_amazon
def test_amazon18_every_csv_row_is_a_window_of_the_rebuilt_sequence():
    import ast
    import csv

    ds = load_amazon18(AMAZON, "Industrial_and_Scientific")
    for split in ("valid", "test"):
        path = next((AMAZON / split).glob("Industrial_and_Scientific_*.csv"))
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                seq = ds.sequences[int(row["user_id"][1:])]
                w = [*ast.literal_eval(row["history_item_id"]), int(row["item_id"])]
                assert any(seq[i : i + len(w)] == w for i in range(len(seq) - len(w) + 1)), row["user_id"]


def test_amazon18_missing_domain_is_named(tmp_path):
    with pytest.raises(DataFormatError, match="Nope.item.json: file not found"):
        load_amazon18(tmp_path, "Nope")


@pytest.mark.parametrize("title", ["A </item> B (1995)", "<item_id>7</item_id> (1990)", "C <item> (1992)"])
def test_a_title_holding_the_answer_markup_is_refused_naming_the_item(tmp_path, title):
    """A title such as ``A </item> B (1995)`` made its own well-formed answer parse as "trailing text": the item was
    served and logged but could never be rewarded. The loader refuses it, naming the file, the item and the rule."""
    quoted = '"' + title.replace('"', '""') + '"'
    d = _write_ml(tmp_path / "bad", ["1,1,4.0,10", "1,2,4.0,11"], movies=["1,A (1990),Drama", f"2,{quoted},Comedy"])
    with pytest.raises(DataFormatError, match=r"movies\.csv: item 2: title .* holds the answer's markup .*rule: "):
        load_movielens(d)


def test_the_loaders_markup_is_the_answer_formats():
    from abpo.data.loaders import ANSWER_MARKUP as LOADER_MARKUP
    from abpo.policy.prompt import ANSWER_MARKUP

    assert set(LOADER_MARKUP) == set(ANSWER_MARKUP)
