"""A real $ABPO_ON_FAILURE hook for the tests (ABPO_ON_FAILURE=failure_hook:record, tests/dags on PYTHONPATH): appends
what it was called with, one JSON line per call, to the file $ABPO_TEST_FAILURE_LOG."""

from __future__ import annotations

import json
import os


def record(*, month: str, task: str, error: BaseException | None, context) -> None:
    with open(os.environ["ABPO_TEST_FAILURE_LOG"], "a") as f:
        f.write(
            json.dumps(
                {
                    "month": month,
                    "task": task,
                    "error_type": type(error).__name__,
                    "cause_type": type(getattr(error, "__cause__", None)).__name__,
                    "error": str(error),
                    "run_id": context["run_id"],
                }
            )
            + "\n"
        )
