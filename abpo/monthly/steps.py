"""The monthly cycle's steps, in the order they run: the one list that the Airflow DAG (dags/abpo_monthly.py: one
task per step, named like it) and ``abpo arms month`` (:func:`abpo.monthly.month.run_month`) both follow, and a
test checks they agree. Each step is the module of the same name in abpo.monthly.

Dependency-free (the DAG file imports it when it is parsed)."""

from __future__ import annotations

ONCE = ("bootstrap", "serve", "ingest")  # once per month, in this order
PER_ARM = {  # then per arm, by the arm's kind (abpo.arms.names), each step taking the one before it
    "llm": ("update", "register", "gate", "promote"),
    "ranker": ("refit",),
    "holdback": ("hold",),  # a no-op that records why the holdback (pi_init, never updated) did not train
}
LAST = ("report",)  # after every arm
STEPS = (*ONCE, *(s for chain in PER_ARM.values() for s in chain), *LAST)
