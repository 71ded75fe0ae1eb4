"""The report's promotion section (step ``report``, abpo.monthly.report), after its gate section: what became of each
LLM arm's gated challenger in the report's months, read from the promotion history (abpo.arms.history): promoted by
the gate, promoted because a human approved it (``arms.approval: required``: who and when), rejected (by whom), not
answered within ``arms.approval_timeout``, or kept out for another reason (pinned, the champion moved). A gate that
failed promotes nothing and records nothing: its row is the gate section's FAIL."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from abpo import registry
from abpo.arms import history, names

if TYPE_CHECKING:
    from abpo.config import Config

COLUMNS = ("Month", "Arm", "Outcome", "Champion", "By", "At", "Why")
OUTCOMES = ("gate", "not-promoted")  # the month's promote step's entries


def month_promotions(cfg: Config, months: Sequence[str]) -> list[history.Entry]:
    """The promote step's history entries (a ``gate`` move or a ``not-promoted`` decision) of ``months``, for every
    LLM arm of arms.names, ordered by month, arm and entry. Reads only: no store yet gives []."""
    uri = cfg.paths.tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return []
    client = registry.tracking_client(cfg)
    experiment = registry.experiment_name(cfg, history.EXPERIMENT)
    wanted = {str(m) for m in months}
    out = []
    for arm in (a for a in cfg.arms.names if names.entry(a).kind == names.LLM):
        out += [e for e in history.read(client, arm, experiment) if e.action in OUTCOMES and e.month in wanted]
    return sorted(out, key=lambda e: (e.month, e.arm, e.seq))


def outcome(e: history.Entry) -> str:
    """The entry in a few words: promoted (approved, with arms.approval = required), rejected, not approved in time,
    or not promoted (pinned, the champion moved, no approval task asked: the Why column says which)."""
    if e.action == "gate":
        return "promoted, approved" if e.reason.startswith("approved by") else "promoted"
    import re

    if re.match(r"v\S+ rejected by ", e.reason):  # abpo.monthly.promote's refusals: "v<challenger> <why>"
        return "rejected"
    if re.match(r"v\S+ no answer within arms\.approval_timeout ", e.reason):
        return "not approved in time"
    return "not promoted"


def promotion_row(e: history.Entry) -> list[str]:
    """One entry's cells, in the order of COLUMNS: By is the approver (or rejecter) when a human answered."""
    champion = f"v{e.from_version} -> v{e.to_version}" if e.from_version != e.to_version else f"v{e.to_version} stays"
    return [e.month, e.arm, outcome(e), champion, e.actor, e.at, e.reason[:240]]


INTRO = (
    "What the month's promote step did with each challenger that passed its gate (the promotion history, `abpo arms "
    "history`): with arms.approval = required, By is who approved or rejected it in Airflow (abpo: no answer in time)."
)


def promotion_section_markdown(entries: Sequence[history.Entry]) -> str:
    lines = ["", "## Promotions", "", INTRO, ""]
    if not entries:
        return "\n".join([*lines, "No challenger passed its gate in these months.", ""])
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for e in entries:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in promotion_row(e)) + " |")
    return "\n".join([*lines, ""])


def promotion_section_html(entries: Sequence[history.Entry]) -> str:
    out = ["<h2>Promotions</h2>", f"<p>{html.escape(INTRO)}</p>"]
    if not entries:
        return "".join([*out, "<p>No challenger passed its gate in these months.</p>"])
    out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "</tr></thead><tbody>")
    for e in entries:
        out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in promotion_row(e)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.promotions.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def add_promotion_section(cfg: Config, months: Sequence[str], markdown: Path, html_path: Path) -> list[history.Entry]:
    """Add the promotion section of ``months`` to the report just written: at the end of its Markdown, before the end
    of its HTML body (each file replaced whole). Returns the entries shown."""
    entries = month_promotions(cfg, months)
    md = Path(markdown).read_text(encoding="utf-8")
    _replace(Path(markdown), md.rstrip("\n") + "\n" + promotion_section_markdown(entries))
    page = Path(html_path).read_text(encoding="utf-8")
    section = promotion_section_html(entries)
    at = page.rfind("</body>")
    _replace(Path(html_path), page[:at] + section + page[at:] if at >= 0 else page + section)
    return entries
