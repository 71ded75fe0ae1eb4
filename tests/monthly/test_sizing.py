"""abpo.monthly.sizing / `abpo arms size-update`: the "beyond the gate's noise" rule on constructed gate numbers,
the table, and (slow) a real grid on a shrunken config: every point starts from the same champion, is registered and
gated, and nothing is promoted."""

from __future__ import annotations

import math

import pytest

from abpo.monthly.sizing import SizingPoint, moves_beyond_noise, sizing_markdown
from tests.sizes import LIKELY_CLICKS, MONTH, without


def test_moves_beyond_noise_on_constructed_gate_numbers():
    # offline: |diff| against 1.96 SE
    assert moves_beyond_noise({"diff": -0.03, "se": 0.01}, None)
    assert moves_beyond_noise({"diff": 0.021, "se": 0.01}, None)
    assert not moves_beyond_noise({"diff": 0.019, "se": 0.01}, None)
    assert not moves_beyond_noise({"diff": 0.0, "se": 0.0}, None)  # no user changed
    assert moves_beyond_noise({"diff": 0.01, "se": 0.0}, None)
    assert not moves_beyond_noise({"diff": math.nan, "se": 0.01}, None)
    # off-policy: the 95% interval of the SNIPS CTR difference excludes 0
    quiet = {"diff": 0.001, "se": 0.01}
    assert moves_beyond_noise(quiet, {"diff": 0.004, "ci_low": 0.001, "ci_high": 0.007})
    assert moves_beyond_noise(quiet, {"diff": -0.004, "ci_low": -0.007, "ci_high": -0.0005})
    assert not moves_beyond_noise(quiet, {"diff": 0.0005, "ci_low": -0.0005, "ci_high": 0.0014})
    assert not moves_beyond_noise(quiet, {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan})


def test_sizing_markdown_has_a_row_per_point():
    pts = [
        SizingPoint(
            ["arms.update_max_examples=1024"],
            7320,
            64,
            40.0,
            "4",
            {"diff": -0.0066, "se": 0.004, "wins": 2, "losses": 6, "mde": 0.013},
            None,
            True,
            False,
        ),
        SizingPoint(
            ["arms.update_max_examples=4096"],
            7320,
            256,
            160.0,
            "5",
            {"diff": 0.03, "se": 0.01, "wins": 30, "losses": 12, "mde": 0.03},
            {"diff": 0.004, "ci_low": 0.001, "ci_high": 0.007},
            True,
            True,
        ),
    ]
    md = sizing_markdown(pts, arm="abpo", month="2026-03")
    rows = [line for line in md.splitlines() if line.startswith("| arms.")]
    assert len(rows) == 2 and rows[0].endswith("| PASS | no |") and rows[1].endswith("| PASS | yes |")
    assert "+0.0040 [+0.0010, +0.0070]" in rows[1] and "2/6" in rows[0]


def test_the_table_and_the_points_are_written_side_by_side(tmp_path):
    import json

    from abpo.monthly.sizing import write_sizing

    point = SizingPoint(["update.max_steps=1"], 10, 1, 2.0, "3", {"diff": 0.01, "se": 0.02}, None, False, False)
    md = sizing_markdown([point], arm="grpo", month="2026-03")
    out = tmp_path / "new" / "sizing.md"
    write_sizing(out, md, [point])
    assert out.read_text() == md
    assert json.loads((tmp_path / "new" / "sizing.json").read_text()) == [point.to_json()]


SMALL = [*without(MONTH, "update.max_steps"), *LIKELY_CLICKS]  # update.max_steps: the grid's and the preset's


@pytest.mark.slow
def test_size_update_runs_a_grid_from_one_champion_and_promotes_nothing(tmp_path, capsys, pi_init_state):
    import json

    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.cli import main
    from abpo.config import load_config

    pi_init_state(load_config("tiny", [f"paths.root={tmp_path}", *SMALL]))  # trained once per session (conftest)
    sets = [x for s in (f"paths.root={tmp_path}", *SMALL) for x in ("--set", s)]
    rc = main(
        [
            "arms",
            "size-update",
            "--config",
            "tiny",
            *sets,
            "--month",
            "2026-01",
            "--arm",
            "grpo",
            "--grid",
            "update.max_steps=1,3",
            "--out",
            str(tmp_path / "sizing.md"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "### Update size on validation month 2026-01, arm grpo" in out
    points = json.loads((tmp_path / "sizing.json").read_text())
    assert [p["overrides"] for p in points] == [["update.max_steps=1"], ["update.max_steps=3"]]
    assert [p["steps"] for p in points] == [1, 3]
    assert points[0]["version"] != points[1]["version"]
    for p in points:
        assert {"diff", "se", "mde", "wins", "losses"} <= set(p["offline"]) and p["off_policy"]["n"] > 0
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *SMALL])
    champ = arm_versions.get_version(cfg, "grpo", "champion")
    assert str(champ.version) == "1"  # the grid's challengers are gated, never promoted
    registry.configure(cfg)
    for p in points:  # each started from that champion
        mv = MlflowClient().get_model_version(arm_versions.model_name("grpo", cfg), p["version"])
        assert mv.tags["parent_version"] == "1" and mv.tags["gate.verdict"] in ("pass", "fail")


def test_a_grid_over_the_shared_rows_is_refused_for_an_arm_with_its_own(tmp_path):
    """arms.update_max_examples_by_arm wins over arms.update_max_examples, so a grid over the latter would size
    nothing for that arm: refused before any step runs (no bootstrap in tmp_path)."""
    from abpo.config import load_config
    from abpo.monthly.sizing import size_update

    base = [f"paths.root={tmp_path}", "arms.update_max_examples_by_arm={grpo: 512}"]
    cfg = load_config("tiny", base)
    with pytest.raises(ValueError, match=r"arms\.update_max_examples_by_arm gives grpo its own \(512\).*rule:"):
        size_update(cfg, "2026-01", "grpo", [["arms.update_max_examples=64"]], lambda o: load_config("tiny", base + o))
    assert not (tmp_path / "mlflow.db").exists()
