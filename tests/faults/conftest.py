"""Faults tried by the route a user takes (the `abpo` command in-process, the DAG's params, the UI plugin's routes),
each against the real DuckDB, MLflow and Great Expectations (issue 18). Their fixtures `state` and `abpo` live in
tests/conftest.py (tests/monthly uses them too)."""
