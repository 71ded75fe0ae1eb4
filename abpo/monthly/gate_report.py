"""The report's gate section (step ``report``, abpo.monthly.report): every gate of the report's months, both halves
and what decided, read from the gates' own recorded results (abpo.monthly.gate.GateResult, the ``task_result.json``
of each completed ``gate-<arm>-v<version>`` run of experiment abpo-arms, docs/gate.md "Reading the verdict").

Per gate: the verdict and which evidence decided (``decided_by``: off-policy, offline or both); the offline half (the test that ran, Tango's score test or Wald, the paired difference with
won/lost users, its one-sided lower bound against -margin, the statistic and p-value, the MDE); the off-policy half
(the estimator that decided, its CTR difference with its interval against -margin and a note where the interval
alone misleads: abpo.monthly.gate_verdict.ope_notes; the rows it read, the ESS) and every other estimator's
difference and interval."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import versions as arm_versions
from abpo.monthly.gate_verdict import ESTIMATOR_NAMES, ope_notes
from abpo.monthly.report_section import append_section, number, section_html, section_markdown

if TYPE_CHECKING:
    from abpo.config import Config

COLUMNS = (
    "Month",
    "Arm",
    "Challenger vs champion",
    "Verdict",
    "Decided by",
    "Offline test",
    "Offline Δ (won/lost)",
    "Offline bound vs −margin",
    "Statistic, p",
    "Off-policy estimator (rows)",
    "Off-policy ΔCTR [interval] vs −margin",
    "ESS",
    "Other estimators' ΔCTR [interval]",
)


def month_gates(cfg: Config, months: Sequence[str]) -> list[dict[str, Any]]:
    """The completed gates of ``months`` (their GateResult JSON with ``month`` added), the latest completed run per
    (month, arm, challenger), ordered by month and arm. No store or experiment yet: []."""
    uri = cfg.paths.tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return []  # no store yet: no gate ran (and none is created here)
    client = registry.tracking_client(cfg)
    exp = registry.experiment_id(client, registry.experiment_name(cfg, arm_versions.EXPERIMENT))
    if exp is None:
        return []
    latest: dict[tuple[str, str, str], tuple[int, dict[str, Any]]] = {}
    for month in months:
        for run in registry.tagged_runs(client, exp, "abpo.month", str(month)):
            name = run.info.run_name or ""
            if not name.startswith("gate-") or run.data.tags.get(registry.TASK_DONE_TAG) != "true":
                continue
            key = (str(month), run.data.tags.get("abpo.arm", ""), run.data.tags.get("abpo.challenger", ""))
            if key in latest and latest[key][0] >= run.info.start_time:
                continue
            latest[key] = (run.info.start_time, {"month": str(month), **registry.task_result(run)})
    return [g for _, (_, g) in sorted(latest.items())]


def gate_row(g: dict[str, Any]) -> list[str]:
    """One gate's cells, in the order of COLUMNS."""
    off = g.get("offline") or {}
    ope = g.get("off_policy") or {}
    method = str(off.get("method", ""))
    test = "Tango score" if method.startswith("Tango") else "Wald" if method else "n/a"
    if ope:
        name = str(ope.get("estimator", "snips"))
        rows = "every arm's" if ope.get("rows") == "all" else "arm's own"
        if ope.get("row_set") == "heldout":
            rows += ", held-out users"
        estimator = f"{ESTIMATOR_NAMES.get(name, name)} ({rows}, {ope.get('n', '?')})"
        margin = ope.get("margin")
        ope_cell = f"{number(ope.get('diff'))} [{number(ope.get('ci_low'))}, {number(ope.get('ci_high'))}]" + (
            f" vs {number(-float(margin))}" if isinstance(margin, (int, float)) else ""
        )
        notes = ope_notes(ope)  # what the interval alone does not say (the gate's reason says it in full)
        if notes:
            ope_cell += f" ({'; '.join(notes)})"
        others = "; ".join(
            f"{ESTIMATOR_NAMES.get(k, k)} {number(d.get('diff'))} [{number(d.get('ci_low'))}, {number(d.get('ci_high'))}]"
            for k, d in (ope.get("estimates") or {}).items()
            if k != name
        )
        ess = number(ope.get("challenger_ess"), ".0f")
    else:
        estimator, ope_cell, others, ess = "not run", "n/a", "", "n/a"
    decided = str(g.get("decided_by") or ("both" if ope else "offline"))  # a record without the field: the old gate
    margin_cell = number(-float(off["margin"])) if "margin" in off else "n/a"
    if decided == "off-policy":  # the offline half a guardrail: its upper bound, refusing only a collapse
        bound = f"upper {number(off.get('upper'))} vs {margin_cell} (guardrail)"
    else:
        bound = f"{number(off.get('lower'))} vs {margin_cell}"
    return [
        str(g.get("month", "")),
        str(g.get("arm", "")),
        f"v{g.get('version', '?')} vs v{g.get('champion_version', '?')}",
        "PASS" if g.get("passed") else "FAIL",
        decided,
        test,
        f"{number(off.get('diff'))} ({off.get('wins', '?')}/{off.get('losses', '?')})",
        bound,
        f"z {number(off.get('statistic'), '.2f')}, p {number(off.get('p_value'), '.3g')}",
        estimator,
        ope_cell,
        ess,
        others,
    ]


INTRO = (
    "Each LLM arm's gate (docs/gate.md). Decided by both (arms.gate_primary = offline): the offline half is a paired "
    "non-inferiority test of per-user HR@5 on the held-out users (PASS needs the lower bound above −margin, i.e. p < "
    "alpha); the off-policy half is the CTR difference under the estimator that decided (arms.gate_ope_estimator), "
    "its interval's lower bound at least −margin; both must pass. Decided by off-policy (arms.gate_primary = ope): "
    "the off-policy difference on rows no update trained on decides, and the offline half is a guardrail that "
    "fails only when its upper bound is below −margin (a collapse). A note in brackets after the interval says where it cannot be read alone (every row "
    "a no-response or every row clicked, an estimate outside [0, 1], an arm that served none of the rows). Every "
    "other estimator's difference is shown beside it; it did not decide."
)


EMPTY = "No gate ran in these months."


def gate_section_markdown(gates: Sequence[dict[str, Any]]) -> str:
    return section_markdown("Gate", INTRO, COLUMNS, [gate_row(g) for g in gates], EMPTY)


def gate_section_html(gates: Sequence[dict[str, Any]]) -> str:
    return section_html("Gate", INTRO, COLUMNS, [gate_row(g) for g in gates], EMPTY)


def add_gate_section(cfg: Config, months: Sequence[str], markdown: Path, html_path: Path) -> list[dict[str, Any]]:
    """Add the gate section of ``months`` to the report just written: at the end of its Markdown, before the end of
    its HTML body (each file replaced whole). Returns the gates shown."""
    gates = month_gates(cfg, months)
    append_section(markdown, html_path, gate_section_markdown(gates), gate_section_html(gates))
    return gates
