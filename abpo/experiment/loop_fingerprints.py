"""What a replicated loop experiment's saved work is keyed by (abpo.experiment.loop_experiment): the fingerprints of
the shared bootstrap and of each replicate (the settings each depends on), the digest of the code that runs a month,
and the saved results found again under them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.experiment.loop_checks import parse_result

if TYPE_CHECKING:
    from abpo.config import Config

# keys that change how fast, not what (left out of every fingerprint)
SPEED_KEYS = {("policy", "num_threads")}
# what the shared bootstrap does not read: the months' traffic, updates, report and the experiment table
BOOTSTRAP_IGNORES = {
    "sim": ("salt", "replicate", "requests_per_user"),
    "arms": ("update_max_examples", "update_logs", "replay_months"),
}
BOOTSTRAP_SECTIONS_IGNORED = ("update", "report")
# abpo's parts that do not run a month (left out of code_digest): the CLI, the A/B analysis (rerun from the saved
# moments) and the loop experiment's own modules (its planning, workers and report: abpo/experiment/loop_*.py)
CODE_DIGEST_SKIPS = ("commands", "abtest")
LOOP_MODULES_PREFIX = ("experiment", "loop_")


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _runs_a_month(rel: Path) -> bool:
    if rel.parts[0] in CODE_DIGEST_SKIPS:
        return False
    folder, prefix = LOOP_MODULES_PREFIX
    return not (len(rel.parts) == 2 and rel.parts[0] == folder and rel.name.startswith(prefix))


def code_digest() -> str:
    """sha256 over the sources that run a month: every abpo module except abpo/commands (the CLI), abpo/abtest (the
    report's analysis, rerun from the saved moments) and the loop experiment's own modules
    (abpo/experiment/loop_*.py), and sql/*.sql. Any change there starts new replicates."""
    from abpo.paths import PACKAGE_DIR, SQL_DIR

    h = hashlib.sha256()
    files = sorted(p for p in PACKAGE_DIR.rglob("*.py") if _runs_a_month(p.relative_to(PACKAGE_DIR)))
    files += sorted(SQL_DIR.glob("*.sql"))
    for p in files:
        h.update(str(p.relative_to(p.parents[1] if p.suffix == ".sql" else PACKAGE_DIR.parent)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def settings_of(cfg: Config) -> dict[str, Any]:
    """The config as a dict, less its name, paths and :data:`SPEED_KEYS`."""
    d = dataclasses.asdict(cfg)
    d.pop("name", None)
    d.pop("paths", None)
    for section, key in SPEED_KEYS:
        d[section].pop(key, None)
    return d


def bootstrap_fingerprint(cfg: Config) -> str:
    """What the shared bootstrap depends on besides the code: the settings less :data:`BOOTSTRAP_IGNORES` and the
    sections it never reads (:data:`BOOTSTRAP_SECTIONS_IGNORED`; of ``experiment`` only validation_fraction,
    pi_init's early stopping)."""
    d = settings_of(cfg)
    for section in BOOTSTRAP_SECTIONS_IGNORED:
        d.pop(section, None)
    d["experiment"] = {"validation_fraction": d["experiment"]["validation_fraction"]}
    for section, keys in BOOTSTRAP_IGNORES.items():
        for k in keys:
            d[section].pop(k, None)
    return digest({"bootstrap": d})


def replicate_fingerprint(cfg: Config, months: list[str]) -> str:
    """What replicate ``cfg.sim.replicate``'s result depends on besides the code: every setting (less paths and
    speed) and the months."""
    return digest({"replicate": settings_of(cfg), "months": months})


def save_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON at ``path``, written whole or not at all (a temporary file beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def load_result(path: Path, fingerprint: str, code: str | None, remedy: str = "") -> dict[str, Any] | None:
    """A finished replicate's (or bootstrap's) saved result with this fingerprint, made by ``code`` (None: by any
    code), else None. LoopExperimentRefused naming the file when it is not a JSON object (``remedy``: how to run its
    work again)."""
    if not path.exists():
        return None
    got = parse_result(path, remedy or f"remove {path.parent} to run it again")
    if got.get("fingerprint") != fingerprint or (code is not None and got.get("code") != code):
        return None
    return got


def start_over_unless(folder: Path, code: str) -> None:
    """A replicate's (or the bootstrap's) folder that another code began is removed, so its work starts over; one
    this code began (an interrupted run) is kept, and resumes. The code is recorded in ``code.txt``."""
    mark = folder / "code.txt"
    if folder.exists() and (not mark.exists() or mark.read_text().strip() != code):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark.write_text(code)
