"""The rendered report: Markdown and HTML carry the same tables, the HTML is self-contained, the PNG is
a real image, the JSON holds the numbers; and the page is checked in a real headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from abpo.abtest.analysis import analyse
from abpo.abtest.markdown import escape_line
from abpo.abtest.render import tables, write_report
from abpo.config.report import ReportConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def report(counts_table):
    return analyse(counts_table, ReportConfig(), source="test counts")


def test_files_and_self_contained_html(report, tmp_path):
    files = write_report(report, tmp_path / "out")
    html = files.html.read_text()
    # no external assets: no <link>, no <script src>, every src is a data: URI
    assert "<link" not in html and "<script" not in html
    srcs = re.findall(r'src="([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(href|src)="(https?:)?//', html)
    embedded = base64.b64decode(srcs[0].split(",", 1)[1])
    assert embedded == files.png.read_bytes() and embedded.startswith(PNG_MAGIC)
    img = mpimg.imread(files.png)
    assert img.shape[0] > 100 and img.shape[1] > 100
    # every table and every explanation is in both renderings
    md = files.markdown.read_text()
    for t in tables(report):
        assert f"<h2>{t.title}</h2>" in html.replace("&#39;", "'") or t.title in html
        assert f"## {t.title}" in md
        assert md.count("\n| ") >= 1
    for text in report.explanations().values():  # as text: escaped for Markdown (the MDE's z_(1-alpha/2))
        assert escape_line(text).split(";")[0] in md
    assert "![CTR per arm and month](ctr_by_arm.png)" in md
    # Markdown rows of the per-arm-per-month table: one per cell
    assert sum(1 for line in md.splitlines() if re.match(r"^\| 2026-0[234] \| ", line)) >= len(report.cells)
    data = json.loads(files.json.read_text())
    assert data["candidate"] == "abpo" and len(data["cells"]) == 12
    assert data["comparisons"][0]["test"]["diff_pp"] == pytest.approx(report.comparisons[0].test.diff_pp)


def test_html_escapes_arm_names(counts_table, tmp_path):
    t = counts_table.set_column(
        1, "arm", [[("<b>x</b>" if a == "popularity" else a) for a in counts_table.column("arm").to_pylist()]]
    )
    files = write_report(analyse(t, ReportConfig()), tmp_path)
    html = files.html.read_text()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_single_month_plot_and_missing_arm(counts_table, tmp_path):
    one = counts_table.filter(
        [
            m == "2026-03" and a != "grpo"
            for m, a in zip(counts_table.column("month").to_pylist(), counts_table.column("arm").to_pylist())
        ]
    )
    files = write_report(analyse(one, ReportConfig()), tmp_path)
    assert files.png.read_bytes().startswith(PNG_MAGIC)
    assert "one month only: no month-to-month trend" in files.markdown.read_text()


# ---- written atomically: a reader never sees a half-written report ----


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_failed_rewrite_leaves_the_previous_report(report, counts_table, tmp_path, monkeypatch):
    from abpo.abtest import render

    out = tmp_path / "reports" / "2026-02..2026-04"
    write_report(report, out)
    (out / "notes.txt").write_text("kept")
    before = _snapshot(tmp_path)
    one = analyse(
        counts_table.filter([m == "2026-03" for m in counts_table.column("month").to_pylist()]), ReportConfig()
    )

    def boom(_report):
        raise RuntimeError("rendering failed midway")

    monkeypatch.setattr(render, "to_json", boom)  # after the PNG, the HTML and the Markdown
    with pytest.raises(RuntimeError, match="midway"):
        write_report(one, out)
    assert _snapshot(tmp_path) == before  # every file as it was, nothing half-new, no temporary left

    real_write = Path.write_bytes
    calls = []

    def disk_full(self, data):
        calls.append(self.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.undo()
    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_report(one, out)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before
    files = write_report(one, out)  # and a successful rewrite replaces the four files, keeping the rest
    after = _snapshot(tmp_path)
    assert set(after) == set(before) and after["reports/2026-02..2026-04/notes.txt"] == b"kept"
    assert after["reports/2026-02..2026-04/report.html"] != before["reports/2026-02..2026-04/report.html"]
    assert json.loads(files.json.read_text())["months"] == ["2026-03"]


def test_new_report_appears_whole_or_not_at_all(report, tmp_path, monkeypatch):
    from abpo.abtest import render

    out = tmp_path / "reports" / "2026-03"
    out.parent.mkdir()
    monkeypatch.setattr(render, "render_html", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("midway")))
    with pytest.raises(RuntimeError):
        write_report(report, out)
    assert not out.exists() and list((tmp_path / "reports").iterdir()) == []
    monkeypatch.undo()
    files = write_report(report, out)
    assert sorted(p.name for p in out.iterdir()) == ["ctr_by_arm.png", "report.html", "report.json", "report.md"]
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["2026-03"]
    # the directory gets the umask's permissions, like one made by mkdir (not mkdtemp's 0700)
    (tmp_path / "plain").mkdir()
    assert out.stat().st_mode == (tmp_path / "plain").stat().st_mode
    assert files.html == out / "report.html" and files.out_dir == out


def test_concurrent_readers_see_whole_files(report, counts_table, tmp_path):
    """A reader polling while the report is rewritten sees the old bytes or the new, never a prefix."""
    import threading

    out = tmp_path / "r"
    write_report(report, out)
    versions = {out.joinpath("report.html").read_bytes()}
    one = analyse(
        counts_table.filter([m == "2026-03" for m in counts_table.column("month").to_pylist()]), ReportConfig()
    )
    seen, done = set(), threading.Event()

    def reader():
        while not done.is_set():
            seen.add(out.joinpath("report.html").read_bytes())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for r in (one, report, one):
            write_report(r, out)
            versions.add(out.joinpath("report.html").read_bytes())
    finally:
        done.set()
        t.join()
    assert seen <= versions


# ---- the page in a real browser ----

PROBE = """<script>
window.addEventListener('load', function () {
  var img = document.getElementById('ctr-plot');
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    imgNaturalWidth: img ? img.naturalWidth : -1,
    imgNaturalHeight: img ? img.naturalHeight : -1,
    ctrRows: document.querySelectorAll('#table-ctr tbody tr').length,
    ztestRows: document.querySelectorAll('#table-ztest tbody tr').length,
    trendRows: document.querySelectorAll('#table-trend tbody tr').length,
    srmRows: document.querySelectorAll('#table-srm tbody tr').length,
    tableWidth: document.getElementById('table-ctr').getBoundingClientRect().width
  });
  document.body.appendChild(out);
});
</script>
"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("ABPO_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium not found but ABPO_REQUIRE_BROWSER=1: run `bash scripts/setup-browser.sh`")
        pytest.skip("chromium not installed (bash scripts/setup-browser.sh installs it)")
    return exe


def _chromium_cmd(exe, tmp_path):
    return [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,2400",
        "--virtual-time-budget=5000",
    ]


def test_html_renders_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    files = write_report(report, tmp_path / "out")
    # the probe goes into a copy: the report itself carries no script
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(files.html.read_text().replace("</body>", PROBE + "</body>"))
    cmd = _chromium_cmd(exe, tmp_path)
    dom = subprocess.run(cmd + ["--dump-dom", probe_page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"probe did not run; DOM tail: {dom.stdout[-1000:]!r} stderr: {dom.stderr[-1000:]!r}"
    probe = json.loads(m.group(1).replace("&quot;", '"'))
    assert probe["imgNaturalWidth"] == 800 and probe["imgNaturalHeight"] == 450  # 8x4.5 in at 100 dpi
    assert probe["ctrRows"] == len(report.cells) == 12
    assert probe["ztestRows"] == len(report.comparisons)
    assert probe["trendRows"] == len(report.trends)
    assert probe["srmRows"] == len(report.srm)
    assert probe["tableWidth"] > 200
    assert "abpo − grpo" in dom.stdout and "2026-04" in dom.stdout
    shot = tmp_path / "report.png"
    res = subprocess.run(
        cmd + [f"--screenshot={shot}", files.html.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.read_bytes().startswith(PNG_MAGIC)
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2400, 1400)
    assert img[..., :3].std() > 0.05  # not a blank page
