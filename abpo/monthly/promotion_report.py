"""The report's promotion section (step ``report``, abpo.monthly.report), after its gate section: what became of each
LLM arm's gated challenger in the report's months, read from the promotion history (abpo.arms.history): promoted by
the gate, promoted because a human approved it (``arms.approval: required``: who and when), rejected (by whom), not
answered within ``arms.approval_timeout``, or kept out for another reason (pinned, the champion moved). A gate that
failed promotes nothing and records nothing: its row is the gate section's FAIL."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from abpo import registry
from abpo.arms import history, names
from abpo.monthly.report_section import append_section, section_html, section_markdown

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
    """One entry's cells, in the order of COLUMNS: By is the approver (or rejecter) when a human answered; Why is the
    recorded reason whole, so an approver's comment (up to 500 characters, after the task and run that asked) is in
    it (the promote step bounds the reason it records)."""
    champion = f"v{e.from_version} -> v{e.to_version}" if e.from_version != e.to_version else f"v{e.to_version} stays"
    return [e.month, e.arm, outcome(e), champion, e.actor, e.at, e.reason]


INTRO = (
    "What the month's promote step did with each challenger that passed its gate (the promotion history, `abpo arms "
    "history`): with arms.approval = required, By is who approved or rejected it in Airflow (abpo: no answer in time)."
)


EMPTY = "No challenger passed its gate in these months."


def promotion_section_markdown(entries: Sequence[history.Entry]) -> str:
    return section_markdown("Promotions", INTRO, COLUMNS, [promotion_row(e) for e in entries], EMPTY)


def promotion_section_html(entries: Sequence[history.Entry]) -> str:
    return section_html("Promotions", INTRO, COLUMNS, [promotion_row(e) for e in entries], EMPTY)


def add_promotion_section(cfg: Config, months: Sequence[str], markdown: Path, html_path: Path) -> list[history.Entry]:
    """Add the promotion section of ``months`` to the report just written: at the end of its Markdown, before the end
    of its HTML body (each file replaced whole). Returns the entries shown."""
    entries = month_promotions(cfg, months)
    append_section(markdown, html_path, promotion_section_markdown(entries), promotion_section_html(entries))
    return entries
