"""Every cell fingerprint the experiment computes today, pinned (issue 34: the split of abpo.experiment.runner keeps
them). Cells are cached under their fingerprint (abpo.experiment.cells.cell_fingerprint), so a change of any value
here makes every cached cell recompute.

The fixture (data/cell_fingerprints.json) holds, for each preset (tiny, demo, gpu, smollm2, amazon18) x logging
regime (the named ones of configs/regimes.yaml on every preset; on tiny also every logger x clicks x candidates
combination of abpo.experiment.regimes, with both foreign loggers) x experiment.rounds (1, 2): the fingerprint of
every row the runner knows (the variants, full_info, the GRPO controls, the baselines) for seeds 0-2 and rounds
1..experiment.rounds. Regenerate it only for a change meant to invalidate the cache:

    PYTHONPATH=$PWD python tests/experiment/test_fingerprints_pinned.py --write
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "cell_fingerprints.json"
REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS = ("tiny", "demo", "gpu", "smollm2", "amazon18")
SEEDS = (0, 1, 2)
ROUNDS = (1, 2)


def known_rows() -> list[str]:
    """Every row name the runner accepts, in its canonical form."""
    from abpo.algo.variants import VARIANTS
    from abpo.experiment.rows import BASELINES, CONTROLS, FULL_INFO, row_key

    names = [*(v.name for v in VARIANTS.values()), FULL_INFO, *CONTROLS, *BASELINES]
    return list(dict.fromkeys(row_key(n) for n in names))


def regime_cases(preset: str) -> dict[str, list[str]]:
    """name -> the experiment.* overrides of the regime."""
    from abpo.config.experiment import CLICKS, FOREIGN, LOG_CANDIDATES, LOGGERS
    from abpo.experiment.regime_settings import regime_overrides

    path = REPO_ROOT / "configs" / "regimes.yaml"
    cases = {n: regime_overrides(n, path) for n in _yaml_names(path)}
    if preset == "tiny":
        for logger, clicks, cands in itertools.product(LOGGERS, CLICKS, LOG_CANDIDATES):
            for foreign in FOREIGN if logger == "foreign" else (None,):
                ov = [
                    f"experiment.logger={logger}",
                    f"experiment.clicks={clicks}",
                    f"experiment.log_candidates={cands}",
                ]
                ov += [f"experiment.foreign_logger={foreign}"] if foreign else []
                cases["/".join(x for x in (logger, foreign, clicks, cands) if x)] = ov
    return cases


def _yaml_names(path: Path) -> list[str]:
    import yaml

    return list(yaml.safe_load(path.read_text()))


def compute(cases: list[dict]) -> list[dict]:
    """The fingerprints of each case (preset, regime overrides, experiment.rounds), keyed row -> 's<seed>r<round>'."""
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint
    from abpo.experiment.rows import experiment_config

    out = []
    for case in cases:
        cfg = experiment_config(
            load_config(case["preset"], [*case["overrides"], f"experiment.rounds={case['rounds']}"])
        )
        fps = {
            row: {f"s{s}r{r}": cell_fingerprint(cfg, row, s, r) for s in SEEDS for r in range(1, case["rounds"] + 1)}
            for row in case["rows"]
        }
        out.append({**case, "fingerprints": fps})
    return out


def all_cases() -> list[dict]:
    rows = known_rows()
    return [
        {"preset": p, "regime": name, "overrides": ov, "rounds": n, "rows": rows}
        for p in PRESETS
        for name, ov in regime_cases(p).items()
        for n in ROUNDS
    ]


def test_every_cell_fingerprint_is_unchanged():
    pinned = json.loads(FIXTURE.read_text())
    assert len(pinned) == len(all_cases()) >= 2 * (5 * 5 + 24)
    fresh = compute([{k: v for k, v in c.items() if k != "fingerprints"} for c in pinned])
    for old, new in zip(pinned, fresh, strict=True):
        changed = {
            (row, k): (v, new["fingerprints"][row][k])
            for row, by in old["fingerprints"].items()
            for k, v in by.items()
            if new["fingerprints"][row][k] != v
        }
        assert not changed, (
            f"{old['preset']} / {old['regime']} / rounds {old['rounds']}: fingerprints changed {changed}"
        )


def test_the_fixture_covers_every_row_and_regime_factor():
    """A new row or regime value must enter the fixture (regenerate it with --write on the code before the change)."""
    from abpo.config.experiment import CLICKS, FOREIGN, LOG_CANDIDATES, LOGGERS

    pinned = json.loads(FIXTURE.read_text())
    assert all(sorted(c["rows"]) == sorted(known_rows()) for c in pinned)
    assert {c["preset"] for c in pinned} == set(PRESETS)
    used = {ov for c in pinned for ov in c["overrides"]}
    for key, values in (
        ("logger", LOGGERS),
        ("foreign_logger", FOREIGN),
        ("clicks", CLICKS),
        ("log_candidates", LOG_CANDIDATES),
    ):
        assert {f"experiment.{key}={v}" for v in values} <= used, key
    fps = [fp for c in pinned for by in c["fingerprints"].values() for fp in by.values()]
    assert len(set(fps)) > len(fps) // 4  # the pins are not one repeated value


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (rewrites {FIXTURE})")
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(c, sort_keys=True) for c in compute(all_cases())]  # one case a line
    FIXTURE.write_text("[\n" + ",\n".join(lines) + "\n]\n")
    print(f"wrote {FIXTURE}")
