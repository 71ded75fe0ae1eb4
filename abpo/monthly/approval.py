"""The human approval of a promotion (``arms.approval: required``, docs/gate.md "Approval"): what the approval task
``<arm>.approve`` of the abpo_monthly DAG asks (:func:`request`: a subject and a Markdown body with the gate's
numbers, read from the gate's result) and what it answers (:class:`Approval`, its XCom), which the promote step
(abpo.monthly.promote) obeys and records in the promotion history.

The task itself is an Airflow human-in-the-loop operator (abpo.monthly.airflow_approval, ``PromotionApproval``: the standard
provider's HITLOperator with the options :data:`APPROVE` and :data:`REJECT`, default :data:`REJECT` when no one
answers within ``arms.approval_timeout``); this module holds what does not need Airflow, so that the promote step and
``abpo arms month`` read the same decisions."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from abpo.monthly.report_section import number

APPROVE, REJECT = "Approve", "Reject"  # the task's two options (the Airflow UI's buttons, the REST API's values)
# Approval.decision: the approver's answer, no answer in time, or why nobody was asked
APPROVED, REJECTED, TIMED_OUT = "approved", "rejected", "timed-out"
NOT_ASKED = "not-asked"  # the gate failed: nothing to approve, the task returns at once
NOT_REQUIRED = "not-required"  # arms.approval is none at run time (the DAG was parsed with it required)
DECISIONS = (APPROVED, REJECTED, TIMED_OUT, NOT_ASKED, NOT_REQUIRED)


@dataclasses.dataclass(frozen=True)
class Approval:
    """The approval task's answer (its XCom): ``decision`` (:data:`DECISIONS`), who answered (``by``: the Airflow
    user's name, "" on a timeout), when (``at``, UTC ISO 8601), the approver's ``comment``, when the task asked
    (``asked_at``), the timeout it waited under, and the task (``<arm>.approve``) and DAG run that asked."""

    decision: str
    by: str = ""
    at: str = ""
    comment: str = ""
    asked_at: str = ""
    timeout: str = ""
    task: str = ""
    run_id: str = ""

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Approval:
        if not isinstance(d, dict) or d.get("decision") not in DECISIONS:
            raise ValueError(
                f"approval {d!r}: rule: a mapping whose decision is one of {list(DECISIONS)} (the XCom of an "
                "<arm>.approve task)"
            )
        return cls(**{f.name: str(d.get(f.name) or "") for f in dataclasses.fields(cls)})

    def sentence(self) -> str:
        """The decision as the promotion history's reason reads it."""
        where = f" (Airflow task {self.task}, run {self.run_id})" if self.task else ""
        said = f': "{self.comment}"' if self.comment else ""
        if self.decision == APPROVED:
            return f"approved by {self.by or 'an unnamed user'} at {self.at}{where}{said}"
        if self.decision == REJECTED:
            return f"rejected by {self.by or 'an unnamed user'} at {self.at}{where}{said}"
        if self.decision == TIMED_OUT:
            return f"no answer within arms.approval_timeout {self.timeout} (asked at {self.asked_at}){where}: rejected"
        return f"approval {self.decision}{where}"


def request(arm: str, month: str, gate: dict[str, Any], timeout: str) -> tuple[str, str]:
    """The approval task's subject and Markdown body for the arm's gate result ``gate`` (GateResult.to_json(), the
    gate task's XCom): the versions, the verdict, the offline half (difference, its one-sided lower bound against the
    margin, the MDE), the off-policy half (the estimator, its difference with the interval, the effective sample size)
    and the gate's own sentence. Numbers the gate did not compute read n/a."""
    version, champion = gate.get("version", "?"), gate.get("champion_version", "?")
    subject = f"Promote {arm} v{version} over champion v{champion} ({month})?"
    off = gate.get("offline") or {}
    ope = gate.get("off_policy") or {}
    metric = gate.get("metric") or off.get("metric") or "offline metric"
    level = 1 - float(off.get("alpha") or 0.025)
    estimator = str(ope.get("estimator") or "snips").upper()
    conf = ope.get("confidence")
    conf_s = f"{float(conf):.0%}" if isinstance(conf, (int, float)) and math.isfinite(conf) else "95%"
    rows = [
        ("Gate", "PASS" if gate.get("passed") else "FAIL"),
        (
            f"Offline Δ{metric} (challenger − champion)",
            f"{number(off.get('diff'))} on {off.get('n', '?')} users ({off.get('wins', '?')} won, "
            f"{off.get('losses', '?')} lost, {off.get('ties', '?')} tied)",
        ),
        (
            f"Offline one-sided {level:.1%} lower bound",
            f"{number(off.get('lower'))} (passes above −margin {number(-float(off.get('margin') or 0))}; "
            f"p {number(off.get('p_value'), '.3g')})",
        ),
        (f"Offline MDE at {number(off.get('power'), '.0%')} power", number(off.get("mde"), ".4f")),
        (
            f"Off-policy ΔCTR ({estimator}, on the month's logged rows it reads: arms.gate_ope_estimator)",
            f"{number(ope.get('diff'))}, {conf_s} interval [{number(ope.get('ci_low'))}, {number(ope.get('ci_high'))}] on "
            f"{ope.get('n', '?')} rows",
        ),
        (
            "Off-policy ESS (challenger / champion)",
            f"{number(ope.get('challenger_ess'), '.1f')} / {number(ope.get('champion_ess'), '.1f')}",
        ),
    ]
    body = "\n".join(
        [
            f"**{arm}**: challenger **v{version}** passed the gate against champion **v{champion}** on month "
            f"{month}. Approve to make v{version} the champion (recorded in `abpo arms history` with your name); "
            f"Reject to keep v{champion}. No answer within {timeout} counts as Reject.",
            "",
            "| | |",
            "|---|---|",
            *(f"| {k} | {v} |" for k, v in rows),
            "",
            f"Gate's reason: {gate.get('reason', '')}",
        ]
    )
    return subject, body


def from_event(
    event: dict[str, Any], *, timeout: str, asked_at: str = "", task: str = "", run_id: str = ""
) -> Approval:
    """The Approval of a human-in-the-loop task's resume event (Airflow's HITL payload: ``chosen_options``,
    ``params_input``, ``responded_at``, ``responded_by_user`` and, from the scheduler's timeout sweep, ``timedout``;
    or an ``error_type`` ``timeout`` event when no default applied). A timeout (or no user) is TIMED_OUT whatever
    option was filled in; otherwise the chosen option decides."""
    common = {"timeout": timeout, "asked_at": asked_at, "task": task, "run_id": run_id}
    if event.get("error_type") == "timeout" or event.get("timedout") or not event.get("responded_by_user"):
        return Approval(TIMED_OUT, at=_iso(event.get("responded_at")), **common)
    user = event["responded_by_user"]
    by = _one_line(str(user.get("name") or user.get("id") or "") if isinstance(user, dict) else str(user))[:200]
    chosen = list(event.get("chosen_options") or [])
    comment = _one_line(str((event.get("params_input") or {}).get("comment") or ""))[:500]
    decision = APPROVED if chosen == [APPROVE] else REJECTED
    return Approval(decision, by=by, at=_iso(event.get("responded_at")), comment=comment, **common)


def _one_line(text: str) -> str:
    """``text`` as one line of printable text, as the promotion history records fields (abpo.arms.history
    .check_text_field refuses control, separator and bidirectional characters): each such character a space."""
    import unicodedata

    from abpo.arms.history import BIDI_CONTROLS

    return " ".join(
        "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in BIDI_CONTROLS else c for c in text).split()
    )


def _iso(t: Any) -> str:
    if t is None:
        return ""
    return t.isoformat(timespec="seconds") if hasattr(t, "isoformat") else str(t)
