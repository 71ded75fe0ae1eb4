"""What a replicated loop experiment (abpo.experiment.loop_experiment) checks before any work: its arguments, the
config, where the report goes, and each saved result it would reuse. Each refusal is one LoopExperimentRefused naming
the argument, file or field and the rule broken (an abpo.errors.ExpectedError: the `abpo` command prints it as one
line, exit code 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError, writable_dir

if TYPE_CHECKING:
    from abpo.config import Config

# --target-mde PP: 0 (no sizing), else a CTR difference in percentage points in this range (a smaller one squared
# underflows in Eq. RS, abpo.abtest.replicated.replicates_for_mde; a difference of CTRs is at most 100 points)
MIN_TARGET_MDE_PP = 0.001
MAX_TARGET_MDE_PP = 100.0
# the count columns of a replicate's per-user moments (sql/report_user_moments.sql)
MOMENT_COUNTS = ("users", "clicks", "impressions", "clicks_sq", "impressions_sq", "clicks_x_impressions")


class LoopExperimentRefused(ExpectedError, ValueError):
    """A loop experiment refused before any work: an argument, the config, --out or a saved result, named with the
    rule it breaks."""


def check_request(
    cfg: Config, *, replicates: int, months: int, workers: int, target_mde_pp: float, out_dir: str | Path | None
) -> None:
    """Every argument of the run, before any work: S >= 1 replicates, N >= 1 months, --workers 0 or >= 1,
    --target-mde 0 or in [:data:`MIN_TARGET_MDE_PP`, :data:`MAX_TARGET_MDE_PP`], a config that leaves
    ``sim.replicate`` at 0 (the experiment numbers its replicates 0..S-1 itself), and an ``out_dir`` that is, or can
    be made, a directory abpo can write (abpo.errors.writable_dir: UsageError)."""
    if replicates < 1:
        raise LoopExperimentRefused(f"--replicates {replicates}: rule: an integer >= 1 (the replicates S)")
    if months < 1:
        raise LoopExperimentRefused(f"--months {months}: rule: an integer >= 1 (the months of each replicate)")
    if workers < 0:
        raise LoopExperimentRefused(f"--workers {workers}: rule: 0 (the machine's cores) or an integer >= 1")
    mde = target_mde_pp
    if not (mde == 0 or (math.isfinite(mde) and MIN_TARGET_MDE_PP <= mde <= MAX_TARGET_MDE_PP)):
        raise LoopExperimentRefused(
            f"--target-mde {mde}: rule: 0 (no sizing) or a number of percentage points from {MIN_TARGET_MDE_PP} to "
            f"{MAX_TARGET_MDE_PP:g}"
        )
    if cfg.sim.replicate != 0:
        raise LoopExperimentRefused(
            f"config sim.replicate = {cfg.sim.replicate}: rule: 0 (the experiment numbers its replicates 0..S-1 itself)"
        )
    if out_dir:
        writable_dir(out_dir, "--out")


def _show(value: Any) -> str:
    """A saved value as its JSON (NaN as NaN), at most 80 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_result(path: Path, remedy: str) -> dict[str, Any]:
    """The JSON object saved at ``path`` (a replicate's result.json, the bootstrap's done.json); LoopExperimentRefused
    naming the file when it is not JSON or not an object (``remedy`` says how to run its work again)."""
    rule = "rule: a saved result is the JSON object its run wrote"
    try:
        got = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoopExperimentRefused(f"{path}: not JSON ({type(e).__name__}: {e}); {rule}; {remedy}") from None
    if not isinstance(got, dict):
        raise LoopExperimentRefused(f"{path}: a {type(got).__name__}, not an object; {rule}; {remedy}")
    return got


def check_result(path: Path, got: dict[str, Any], months: list[str], replicate: int, remedy: str) -> None:
    """A replicate's saved result, before it is reused: its replicate number, its months (those of this run, each
    with finite seconds >= 0) and its per-user moments (period one of the months or 'all', an arm name, finite
    counts >= 0). LoopExperimentRefused naming the file and the first field that breaks its rule."""

    def refuse(field: str, value: Any, rule: str) -> None:
        raise LoopExperimentRefused(f"{path}: {field} {_show(value)}; rule: {rule}; {remedy}")

    def a_list(field: str) -> list[Any]:
        v = got.get(field)
        if not isinstance(v, list):
            raise LoopExperimentRefused(
                f"{path}: {field}: a {type(v).__name__}, not a list; rule: a saved result holds its {field} as a "
                f"list; {remedy}"
            )
        return v

    if got.get("replicate") != replicate:
        refuse("replicate", got.get("replicate"), f"{replicate}, the replicate its folder's fingerprint is for")
    ms = a_list("months")
    if [m.get("month") if isinstance(m, dict) else m for m in ms] != months:
        refuse(
            "months",
            [m.get("month") if isinstance(m, dict) else m for m in ms],
            f"the months of this run, {_show(months)}",
        )
    for i, m in enumerate(ms):
        if not _count(m.get("seconds")):
            refuse(f"months[{i}].seconds", m.get("seconds"), "a finite number >= 0")
    periods = {*months, "all"}
    for i, row in enumerate(a_list("moments")):
        if not isinstance(row, dict):
            refuse(f"moments[{i}]", row, "an object (period, arm, users, clicks, impressions, ...)")
        if row.get("period") not in periods:
            refuse(f"moments[{i}].period", row.get("period"), f"one of {sorted(periods)}")
        if not isinstance(row.get("arm"), str) or not row.get("arm"):
            refuse(f"moments[{i}].arm", row.get("arm"), "an arm's name")
        for k in MOMENT_COUNTS:
            if not _count(row.get(k)):
                refuse(f"moments[{i}].{k}", row.get(k), "a finite count >= 0 (sql/report_user_moments.sql)")
    if not _count(got.get("seconds")):
        refuse("seconds", got.get("seconds"), "a finite number >= 0")


def _count(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def finished_cleanly(got: dict[str, Any]) -> bool:
    """Whether a saved result records that a run holding the state's lock received it from its worker and wrote it
    (``run``: that run's id, ``clean``: true); a result a worker wrote itself, for a run that was gone, has no such
    record."""
    return isinstance(got.get("run"), str) and bool(got.get("run")) and got.get("clean") is True


def check_bootstrap(path: Path, got: dict[str, Any], remedy: str) -> None:
    """The shared bootstrap's saved ``done.json``, before it is reused: its seconds (the sizing's cost) a finite
    number >= 0 and its state a path."""
    if not _count(got.get("seconds")):
        raise LoopExperimentRefused(
            f"{path}: seconds {_show(got.get('seconds'))}; rule: a finite number >= 0; {remedy}"
        )
    if not isinstance(got.get("state"), str):
        raise LoopExperimentRefused(f"{path}: state {_show(got.get('state'))}; rule: its state's path; {remedy}")
