"""The report's section of the simulator's expected CTR (issue 60 point 4), from hand-written figures files in the
state (what the serve step stores, abpo.abtest.sim_ctr): the table month x arm with its reference rows, the climb
chart embedded in report.html and linked from report.md, deterministic bytes, the online bound recorded only on the
month's own requests, and no section at all for months the simulator did not serve (production)."""

from __future__ import annotations

import base64
import json
import re
import struct

import pytest

from abpo.abtest import sim_ctr
from abpo.abtest.analysis import analyse
from abpo.abtest.render import write_report
from abpo.config.report import ReportConfig
from tests.abtest.conftest import ARMS, MONTHS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHA = "f" * 64


def figures(month: str, arms: dict[str, tuple], start: float | None = 0.09, sha: str = SHA) -> dict:
    """A month's figures as the serve step writes them: arm -> (expected, own users', realised, impressions)."""
    return {
        "month": month,
        "what": "hand-written",
        "requests": {"month": 7320, "scored": 610, "sample": "one request per user", "sha256": sha},
        "exposure_tau": 1.0,
        "intercept": -2.5,
        "models_scored": 3,
        "arms": {
            a: {
                "model": f"{a} v2",
                "model_version": "2",
                "expected_ctr": e,
                "expected_ctr_own": o,
                "scored_own": 100,
                "impressions": n,
                "clicks": 0 if r is None else round(r * n),
                "realised_ctr": r,
            }
            for a, (e, o, r, n) in arms.items()
        },
        "reference": {
            "start": None if start is None else {"model": "pi_init (abpo-recommender v1)", "expected_ctr": start},
            "oracle_greedy": 0.25,
            "random_floor": 0.055,
        },
    }


def bound(sha: str = SHA, value: float = 0.0965) -> dict:
    return {
        "month": "2026-03",
        "arm": "abpo",
        "parent_version": "2",
        "requests_sha256": sha,
        "online_bound": value,
        "logged_update": 0.0901,
        "pi_init": 0.09,
    }


@pytest.fixture
def cfg(make_cfg):
    return make_cfg()


@pytest.fixture
def report(counts_table):
    return analyse(counts_table, ReportConfig(), source="test counts")


def two_simulated_months(cfg) -> None:
    """2026-02 and 2026-03 simulated (their figures stored), 2026-04 not (a production month)."""
    sim_ctr.write_month_figures(
        cfg, "2026-02", figures("2026-02", {"abpo": (0.09, 0.091, 0.088, 1000), "grpo": (0.09, 0.089, 0.093, 990)})
    )
    sim_ctr.write_month_figures(
        cfg, "2026-03", figures("2026-03", {"abpo": (0.095, 0.096, 0.094, 1000), "grpo": (0.0905, None, None, 0)})
    )


def test_the_section_shows_each_simulated_month_and_arm_with_its_references(cfg, report, tmp_path):
    two_simulated_months(cfg)
    sim_ctr.write_online_bound(cfg, "2026-03", bound())
    sim = sim_ctr.load_sim_ctr(cfg, MONTHS)
    assert [m.month for m in sim.months] == ["2026-02", "2026-03"]  # 2026-04 has no figures: not in the section
    files = write_report(report, tmp_path / "out", sim)
    md, html = files.markdown.read_text(), files.html.read_text()

    assert f"## {sim_ctr.TITLE}" in md and "Not a measurement: the simulator's expected CTR" in md
    assert "| 2026-03 | abpo | abpo v2 | 9.50% | +0.50 | 9.60% | 9.40% | 1,000 |" in md
    assert "| 2026-03 | grpo | grpo v2 | 9.05% | +0.05 | n/a | n/a | 0 |" in md  # no request of its own users
    assert "| 2026-02 | reference: pi_init | pi_init (abpo-recommender v1) | 9.00% | +0.00 | n/a | n/a | n/a |" in md
    assert (
        "| 2026-03 | reference: online bound | grpo with the simulator's reward, from abpo v2 | 9.65% | +0.65 |" in md
    )
    assert "| 2026-03 | reference: abpo update, logged reward | from abpo v2, same rows | 9.01% | +0.01 |" in md
    assert f"| 2026-02 | reference: online bound | not computed ({sim_ctr.BOUND_HOW}) | n/a |" in md
    assert "| 2026-02 | reference: oracle-greedy | best candidate | 25.00% | +16.00 |" in md
    assert "| 2026-02 | reference: random candidate | uniform | 5.50% | -3.50 |" in md
    assert "| 2026-04 | reference" not in md and "| 2026-04 | abpo | abpo v2" not in md
    assert f"online bound not computed for 2026-02 (it is: {sim_ctr.BOUND_HOW}, after the month)" in md
    assert "610 of 7,320 in 2026-02" in md  # the scored sample is named
    assert f"![The simulator's expected CTR per arm and month]({sim_ctr.PNG_NAME})" in md

    # the chart is a real PNG, embedded in the HTML as the same bytes as the file the Markdown links
    assert files.sim_png == files.out_dir / sim_ctr.PNG_NAME
    png = files.sim_png.read_bytes()
    assert png.startswith(PNG_MAGIC)
    embedded = re.search(r'id="sim-ctr-plot"[^>]*src="data:image/png;base64,([^"]+)"', html)
    assert embedded and base64.b64decode(embedded.group(1)) == png
    assert 'id="table-sim_ctr"' in html and "reference: online bound" in html
    assert html.index('id="table-sim_ctr"') > html.index('id="table-srm"')  # after the measured tables
    stored = json.loads((files.out_dir / sim_ctr.JSON_NAME).read_text())
    assert [m["month"] for m in stored["months"]] == ["2026-02", "2026-03"]
    assert stored["months"][1]["online_bound"]["online_bound"] == 0.0965


def png_chunks(png: bytes) -> list[str]:
    out, at = [], 8
    while at < len(png):
        (n,) = struct.unpack(">I", png[at : at + 4])
        out.append(png[at + 4 : at + 8].decode("ascii"))
        at += 12 + n
    return out


def test_the_chart_is_deterministic_and_carries_no_metadata(cfg, report, tmp_path):
    two_simulated_months(cfg)
    sim = sim_ctr.load_sim_ctr(cfg, MONTHS)
    a = write_report(report, tmp_path / "a", sim).sim_png.read_bytes()
    b = write_report(report, tmp_path / "b", sim_ctr.load_sim_ctr(cfg, MONTHS)).sim_png.read_bytes()
    assert a == b
    assert not {"tEXt", "iTXt", "zTXt", "tIME"} & set(png_chunks(a)), png_chunks(a)
    sim_ctr.write_online_bound(cfg, "2026-03", bound())
    assert sim_ctr.plot_png(sim_ctr.load_sim_ctr(cfg, MONTHS)) != a  # the bound's line is drawn


def test_production_months_have_no_section_and_a_rewrite_drops_an_earlier_chart(cfg, report, tmp_path):
    assert sim_ctr.load_sim_ctr(cfg, MONTHS) is None  # nothing stored: production
    out = tmp_path / "out"
    files = write_report(report, out, None)
    md, html = files.markdown.read_text(), files.html.read_text()
    assert "expected CTR" not in md and "sim-ctr" not in html and "table-sim_ctr" not in html
    assert files.sim_png is None
    assert sorted(p.name for p in out.iterdir()) == ["ctr_by_arm.png", "report.html", "report.json", "report.md"]

    two_simulated_months(cfg)
    write_report(report, out, sim_ctr.load_sim_ctr(cfg, MONTHS))
    assert (out / sim_ctr.PNG_NAME).is_file() and (out / sim_ctr.JSON_NAME).is_file()
    write_report(report, out, None)  # the same directory rewritten without simulated months
    assert sorted(p.name for p in out.iterdir()) == ["ctr_by_arm.png", "report.html", "report.json", "report.md"]


def test_a_damaged_file_is_named_in_the_section_and_does_not_fail_the_report(cfg, report, tmp_path):
    two_simulated_months(cfg)
    path = sim_ctr.figures_path(cfg, "2026-02")
    data = json.loads(path.read_text())
    del data["arms"]["grpo"]["expected_ctr"]
    path.write_text(json.dumps(data))
    sim_ctr.bound_path(cfg, "2026-03").write_text("{not json")
    sim = sim_ctr.load_sim_ctr(cfg, MONTHS)
    assert [m.month for m in sim.months] == ["2026-03"]
    md = write_report(report, tmp_path / "out", sim).markdown.read_text()
    assert f"2026-02 left out: {path}: field arms.grpo.expected_ctr missing" in md
    assert f"2026-03: online bound not shown: {sim_ctr.bound_path(cfg, '2026-03')}: not readable as JSON" in md
    with pytest.raises(sim_ctr.SimCtrFileError, match=r"2026-02\.json: field arms\.grpo\.expected_ctr missing"):
        sim_ctr.read_month_figures(cfg, "2026-02")


def test_the_online_bound_is_recorded_only_on_the_requests_the_month_served(cfg):
    with pytest.raises(ValueError, match=r"2026-03\.json: no expected-CTR figures of month 2026-03; rule: "):
        sim_ctr.write_online_bound(cfg, "2026-03", bound())
    two_simulated_months(cfg)
    with pytest.raises(ValueError, match=r"2026-03\.json: requests\.sha256 ffffffffffff\.\.\., the bound's requests "):
        sim_ctr.write_online_bound(cfg, "2026-03", bound(sha="0" * 64))
    assert not sim_ctr.bound_path(cfg, "2026-03").exists()
    with pytest.raises(sim_ctr.SimCtrFileError, match=r"field online_bound = nan; rule: a number"):
        sim_ctr.write_online_bound(cfg, "2026-03", bound(value=float("nan")))
    path = sim_ctr.write_online_bound(cfg, "2026-03", bound())
    first = path.read_bytes()
    assert sim_ctr.write_online_bound(cfg, "2026-03", bound()).read_bytes() == first  # a rerun: the same bytes
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "2026-02.json",
        "2026-03.json",
        "2026-03.online_bound.json",
    ]


def test_the_figures_are_checked_before_they_are_stored(cfg):
    bad = figures("2026-02", {"abpo": (0.09, 0.09, 0.09, 10)})
    bad["arms"]["abpo"]["impressions"] = "ten"
    with pytest.raises(sim_ctr.SimCtrFileError, match=r"2026-02\.json: field arms\.abpo\.impressions = 'ten'"):
        sim_ctr.write_month_figures(cfg, "2026-02", bad)
    assert not sim_ctr.figures_dir(cfg).exists() or not list(sim_ctr.figures_dir(cfg).iterdir())


def test_report_from_warehouse_reads_the_states_figures(warehouse_root, tmp_path):
    """The report the monthly step and `abpo report --months` write (from the warehouse) picks the figures up from
    the state it reads: the section for the simulated months only."""
    from abpo.abtest.report import report_from_warehouse
    from abpo.config import Config

    cfg = Config()
    cfg.paths.root = str(warehouse_root)
    cfg.report.arm_shares = {"abpo": 0.4, "grpo": 0.2, "ml_retrain": 0.2, "popularity": 0.2}
    sim_ctr.write_month_figures(
        cfg, "2026-03", figures("2026-03", {a: (0.09, 0.09, 0.09, 100) for a in ARMS}, start=None)
    )
    try:
        _, files = report_from_warehouse(cfg, MONTHS, out_dir=tmp_path / "out", log_mlflow=False)
        md = files.markdown.read_text()
        assert "| 2026-03 | ml_retrain | ml_retrain v2 | 9.00% | n/a | 9.00% | 9.00% | 100 |" in md
        assert "| 2026-02 | abpo | abpo v2" not in md and "reference: pi_init" not in md  # no starting model
        assert files.sim_png is not None and files.sim_png.is_file()
    finally:
        sim_ctr.figures_path(cfg, "2026-03").unlink()


def test_the_ui_serves_the_chart_the_markdown_links(cfg, report):
    """The Airflow UI's report pages (abpo.monthly.pages) serve the chart and its figures beside the report's files,
    so the link in a report.md opened there resolves."""
    from abpo.abtest.report import default_out_dir
    from abpo.monthly import pages

    two_simulated_months(cfg)
    out = default_out_dir(cfg, "2026-02..2026-04")
    write_report(report, out, sim_ctr.load_sim_ctr(cfg, MONTHS))
    for name in (sim_ctr.PNG_NAME, sim_ctr.JSON_NAME):
        assert pages.report_file(cfg, "2026-02..2026-04", name) == (out / name).resolve()
