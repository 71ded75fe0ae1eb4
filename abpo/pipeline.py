"""The monthly pipeline's steps as plain functions, and `abpo demo`: the main job end to end on the
embedded defaults. (The Airflow DAG in dags/ wires these same functions.)"""

from __future__ import annotations

import argparse


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="Run the main job end to end on the embedded defaults and say what it produced.",
        description="Run the main job end to end on the embedded defaults (bundled MovieLens, DuckDB, "
        "SQLite-backed MLflow, the tiny CPU model) and print what it produced and where.",
    )
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace, cfg) -> int:
    raise NotImplementedError("demo: being assembled")
