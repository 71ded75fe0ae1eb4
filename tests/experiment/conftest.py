"""Fixtures of the experiment tests: a MovieLens-format directory of the bundled MovieLens's first users."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_first_movielens_users(dst: Path, n_users: int = 40) -> Path:
    """The first n_users users of the bundled MovieLens (their ratings) and the movies they rated, in MovieLens
    format."""
    src = REPO_ROOT / "data" / "ml-latest-small"
    with open(src / "ratings.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["userId"]) <= n_users]
    items = {r["movieId"] for r in rows}
    with open(src / "movies.csv", newline="", encoding="utf-8") as f:
        movies = [m for m in csv.DictReader(f) if m["movieId"] in items]
    dst.mkdir(parents=True)
    with open(dst / "ratings.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["userId", "movieId", "rating", "timestamp"])
        w.writeheader()
        w.writerows(rows)
    with open(dst / "movies.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["movieId", "title", "genres"])
        w.writeheader()
        w.writerows(movies)
    return dst


@pytest.fixture(scope="session")
def small_movielens():
    """Factory: small_movielens(dst, n_users=40) -> ``dst``, a MovieLens-format directory of the bundled MovieLens's
    first n_users users (their ratings) and the movies they rated."""
    return write_first_movielens_users
