"""An arm's champion moves here, and only here: the promotion lock (a registered model per arm, see below), pins,
:func:`promote`, :func:`rollback` and the record of a champion moved by hand in MLflow (abpo.arms.history). The lock itself
and the refusals a promotion raises are abpo.arms.promotion_lock."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from abpo import registry
from abpo.arms import history, names
from abpo.arms.promotion_lock import (
    ChampionMoved,
    HoldbackNeverPromoted,
    MoveFenced,
    PromotionRace,
    fence,
    promotion_lock,
)
from abpo.arms.versions import NotInRegistry, get_version, model_name, register_version, set_alias, set_tags

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ governance
PIN_TAG = "abpo.pinned"  # on the arm's registered model: "<version>|<actor>|<at>|<reason>", absent when not pinned


def pinned(cfg: Config, arm: str) -> dict[str, str] | None:
    """The arm's pin ({version, actor, at, reason}) or None: while pinned, the gate (and a ranker's refit) do not
    promote over the champion a human chose."""
    raw = (registry.model_tags(cfg, model_name(arm, cfg)) or {}).get(PIN_TAG, "")
    if not raw:
        return None
    version, actor, at, reason = (raw.split("|", 3) + ["", "", "", ""])[:4]
    return {"version": version, "actor": actor, "at": at, "reason": reason}


def _set_pin(cfg: Config, arm: str, version: str, actor: str, reason: str) -> None:
    from datetime import UTC, datetime

    at = datetime.now(UTC).isoformat(timespec="seconds")
    registry.set_model_tag(
        cfg, model_name(arm, cfg), PIN_TAG, f"{version}|{actor}|{at}|{reason}".replace("\n", " ")[:4900]
    )


def pin(cfg: Config, arm: str, *, reason: str = "", actor: str = "") -> dict[str, str]:
    """Pin the arm's champion: the gate still runs and reports, but its promote records "pinned: not promoted"
    instead of moving the champion, until :func:`unpin`. Recorded in the history (action pin)."""
    actor = actor or history.os_actor()
    with promotion_lock(cfg, arm):
        cur = _champion(cfg, arm)
        if not cur:
            raise NotInRegistry(f"{model_name(arm, cfg)}: no champion to pin")
        _settle(cfg, arm, cur)
        _record_hand_move(cfg, arm, cur, month="")
        _set_pin(cfg, arm, cur, actor, reason or "pinned")
        history.record(cfg, arm, action="pin", actor=actor, from_version=cur, to_version=cur, reason=reason or "pinned")
    return {"arm": arm, "champion": cur, "pinned": "true"}


def unpin(cfg: Config, arm: str, *, reason: str = "", actor: str = "") -> dict[str, str]:
    """Let the gate promote the arm again; recorded in the history (action unpin)."""
    actor = actor or history.os_actor()
    with promotion_lock(cfg, arm):
        cur = _champion(cfg, arm)
        was = pinned(cfg, arm)
        if was is None:
            return {"arm": arm, "champion": cur, "pinned": "false"}
        registry.delete_model_tag(cfg, model_name(arm, cfg), PIN_TAG)
        history.record(
            cfg,
            arm,
            action="unpin",
            actor=actor,
            from_version=cur,
            to_version=cur,
            reason=reason or f"unpinned (pinned by {was['actor']} at {was['at']})",
        )
    return {"arm": arm, "champion": cur, "pinned": "false"}


def _champion(cfg: Config, arm: str) -> str:
    mv = get_version(cfg, arm, registry.CHAMPION)
    return str(mv.version) if mv is not None else ""


def _settle(cfg: Config, arm: str, champion: str) -> None:
    import logging

    for line in history.settle_pending(cfg, arm, champion):
        logging.getLogger(__name__).info(f"{model_name(arm, cfg)} promotion history: {line}")


def _record_hand_move(cfg: Config, arm: str, cur: str, *, month: str) -> history.Entry | None:
    """Under the lock: when the champion is not the history's last one, record the move as made outside abpo
    (action and actor ``mlflow-ui``) and pin the arm (a human's choice: the gate does not promote over it until
    `abpo arms unpin`); a history that does not exist yet starts with a ``baseline`` entry. Returns the recorded
    hand move, or None."""
    last = history.last_move(cfg, arm)
    if last is None:
        if cur:
            history.record(
                cfg,
                arm,
                action="baseline",
                actor="abpo",
                from_version="",
                to_version=cur,
                reason="history started: champion as found",
                month=month,
            )
        return None
    if not cur or last.to_version == cur:
        return None
    where = f"the start of month {month}" if month else "the next governance step"
    why = (
        f"champion alias moved outside abpo (v{last.to_version} -> v{cur}, by hand in MLflow: actor unknown), "
        f"detected at {where}; pinned until `abpo arms unpin`"
    )
    entry = history.record(
        cfg,
        arm,
        action="mlflow-ui",
        actor="mlflow-ui",
        from_version=last.to_version,
        to_version=cur,
        reason=why,
        verdict=_verdict(cfg, arm, cur),
        month=month,
    )
    if pinned(cfg, arm) is None or pinned(cfg, arm)["version"] != cur:
        _set_pin(cfg, arm, cur, "mlflow-ui", "moved by hand in MLflow")
    return entry


def register_champion(cfg: Config, arm: str, model_uri: str, run_id: str, tags: dict[str, str]):
    """Register ``model_uri`` (logged by ``run_id``) as a version of the arm's model with ``tags``
    (abpo.arms.versions.register_version: a retry of the same run reuses its version) and make it the champion under
    the arm's promotion lock, recorded in the promotion history (action bootstrap for a pi_init or bootstrap source,
    else promote). Already the champion: nothing moves."""
    mv = register_version(cfg, arm, model_uri, run_id, tags, alias=None)
    name = model_name(arm, cfg)
    with promotion_lock(cfg, arm):
        current = get_version(cfg, arm, registry.CHAMPION)
        cur = str(current.version) if current is not None else ""
        if cur != str(mv.version):
            _settle(cfg, arm, cur)
            entry = history.begin(
                cfg,
                arm,
                action="bootstrap" if (tags.get("source") in ("pi_init", "bootstrap")) else "promote",
                actor="abpo",
                from_version=cur,
                to_version=str(mv.version),
                reason=f"registered as champion ({tags.get('source', '')})",
            )
            _fenced_move(cfg, arm, entry, str(mv.version), cur)
    return registry.model_version(cfg, name, mv.version)


def check_champion(cfg: Config, arm: str, month: str = "") -> history.Entry | None:
    """At the start of a month (bootstrap): compare the arm's champion with the last entry of its history; a move
    made by hand in MLflow is recorded (:func:`_record_hand_move`) and returned (the DAG emits the champion Asset
    event for it). None when the history agrees (or starts now)."""
    with promotion_lock(cfg, arm):
        cur = _champion(cfg, arm)
        _settle(cfg, arm, cur)
        return _record_hand_move(cfg, arm, cur, month=month)


def _verdict(cfg: Config, arm: str, version: str) -> str:
    mv = get_version(cfg, arm, str(version)) if version else None
    tags = (mv.tags or {}) if mv is not None else {}
    v = tags.get("gate.verdict", "")
    return f"{v}: {tags.get('gate.reason', '')}"[:4900] if v else ""


def promote(
    cfg: Config,
    arm: str,
    version: str | int,
    *,
    expected_champion: str | int | None = None,
    reason: str = "",
    actor: str = "",
    action: str = "promote",
    verdict: str = "",
    month: str = "",
    respect_pin: bool = False,
    tags: dict[str, str] | None = None,
) -> dict[str, str]:
    """Move the arm's ``champion`` alias to ``version``, recorded in the promotion history (abpo.arms.history:
    who, when, from, to, why, the gate's verdict) in one recorded step: the entry is written pending, the alias
    moves, then the version's tags (``promoted_from``, ``promoted_at``, ``promoted_reason``), then the entry is
    finished. With ``expected_champion`` the promotion is refused (PromotionRace; ChampionMoved when the history
    says a recorded move changed it) when the champion is not that version. ``respect_pin`` (the gate's and a
    refit's promotions): a pinned arm is not promoted; the history records "pinned: not promoted" and the result
    says ``promoted: "false"``. ``action`` ``gate`` (the month's promote step): a champion other than
    ``expected_champion`` (the one the month's update started from) is recorded as "not-promoted" and raises
    ChampionMoved. ``tags``: more version tags set with those (the approver's: ``approved_by``, ``approved_at``).

    Atomic: the champion is re-read, compared and moved inside the arm's :func:`promotion_lock`, so of several
    concurrent promotions expecting the same champion exactly one moves it and the others are refused. A holdback
    arm (abpo.arms.names.HOLDBACK) is never promoted: its champion stays pi_init (HoldbackNeverPromoted)."""
    name = model_name(arm, cfg)  # an unknown arm: NotInRegistry, one line
    if names.entry(arm).kind == names.HOLDBACK:
        raise HoldbackNeverPromoted(
            f"{name}: arm {arm} is a holdback; rule: its champion stays "
            f"pi_init, never promoted (version {version} refused)"
        )
    if get_version(cfg, arm, str(version)) is None:
        raise NotInRegistry(f"{name}: no version {version}; nothing promoted")
    for attempt in (1, 2):
        try:
            with promotion_lock(cfg, arm):
                return _promote_locked(
                    cfg,
                    arm,
                    str(version),
                    expected_champion=expected_champion,
                    reason=reason,
                    actor=actor or history.os_actor(),
                    action=action,
                    verdict=verdict or _verdict(cfg, arm, str(version)),
                    month=month,
                    respect_pin=respect_pin,
                    tags=tags or {},
                )
        except MoveFenced as e:
            # the lock was taken over (or the champion moved) while this promotion stalled: nothing moved. With an
            # expected champion, look once more under the lock: the check against it decides (a gate's promotion
            # over a rollback is recorded not-promoted: ChampionMoved); without one, a human's promotion is not
            # replayed over whatever the other holder did
            if expected_champion is None or attempt == 2:
                raise
            log.warning(f"{e}; looking again under the lock")
    raise AssertionError("unreachable")  # the loop returns or raises


def refuse(
    cfg: Config, arm: str, version: str | int, *, actor: str, reason: str, verdict: str = "", month: str = ""
) -> history.Entry | None:
    """Record that ``version`` was not promoted for ``reason`` (a human rejected it, or no one approved it in time:
    abpo.monthly.promote) as a ``not-promoted`` entry that leaves the champion where it is, under the arm's promotion
    lock (a hand move since the last entry is recorded first). Recorded once: when the history already holds the same
    refusal for the same month (a retried or re-run step), nothing is written and None is returned."""
    actor = actor or history.os_actor()
    with promotion_lock(cfg, arm):
        cur = _champion(cfg, arm)
        _settle(cfg, arm, cur)
        _record_hand_move(cfg, arm, cur, month=month)
        reason = reason[:5900]
        if any(
            e.action == "not-promoted" and e.month == month and e.reason == reason for e in history.entries(cfg, arm)
        ):
            return None
        return _record_not_promoted(
            cfg, arm, cur, actor=actor, reason=reason, verdict=verdict or _verdict(cfg, arm, str(version)), month=month
        )


def _record_not_promoted(
    cfg: Config, arm: str, champion: str, *, actor: str, reason: str, verdict: str, month: str
) -> history.Entry:
    """A ``not-promoted`` entry: the champion stays ``champion`` (from and to), for ``reason`` (at most 5,900
    characters, what an MLflow param holds with the history's other fields)."""
    return history.record(
        cfg,
        arm,
        action="not-promoted",
        actor=actor,
        from_version=champion,
        to_version=champion,
        reason=reason[:5900],
        verdict=verdict,
        month=month,
    )


def _promote_locked(
    cfg: Config,
    arm: str,
    version: str,
    *,
    expected_champion,
    reason: str,
    actor: str,
    action: str,
    verdict: str,
    month: str,
    respect_pin: bool,
    tags: dict[str, str],
) -> dict[str, str]:
    from datetime import UTC, datetime

    cur = _champion(cfg, arm)
    _settle(cfg, arm, cur)
    last = history.last_move(cfg, arm)
    if cur == version and (
        expected_champion is None
        or (last is not None and last.to_version == version and last.from_version == str(expected_champion))
    ):
        # already done (a retried promote task whose first attempt moved the alias, a rerun of a completed month):
        # nothing to move, nothing recorded
        return {
            "arm": arm,
            "champion": cur,
            "previous": str(expected_champion or cur),
            "promoted": "true",
            "already": "true",
        }
    hand = _record_hand_move(cfg, arm, cur, month=month)
    if expected_champion is not None and cur != str(expected_champion):
        since = [e for e in history.entries(cfg, arm) if e.moved and e.to_version == cur]
        how = f" ({since[-1].action} by {since[-1].actor} at {since[-1].at}: {since[-1].reason[:200]})" if since else ""
        msg = (
            f"{model_name(arm, cfg)}: champion is v{cur or 'none'}, not the expected v{expected_champion}{how}; "
            f"v{version} not promoted"
        )
        if action == "gate":  # the month's promotion: its challenger was gated against a champion that no longer serves
            _record_not_promoted(
                cfg,
                arm,
                cur,
                actor=actor,
                reason=f"champion moved during the month: {msg}",
                verdict=verdict,
                month=month,
            )
            raise ChampionMoved(msg + " (the champion moved since the month started; the next month starts from it)")
        raise PromotionRace(msg + " (look again and retry)")
    if cur == version:
        return {"arm": arm, "champion": cur, "previous": cur, "promoted": "true"}
    pin_now = pinned(cfg, arm) if respect_pin else None
    if pin_now is not None:
        why = (
            f"pinned: not promoted (v{version} stays; champion v{cur} pinned by {pin_now['actor']} at "
            f"{pin_now['at']}: {pin_now['reason']})" + (" — a hand move just recorded" if hand else "")
        )
        _record_not_promoted(cfg, arm, cur, actor=actor, reason=why, verdict=verdict, month=month)
        return {"arm": arm, "champion": cur, "previous": cur, "promoted": "false", "reason": why}
    entry = history.begin(
        cfg,
        arm,
        action=action,
        actor=actor,
        from_version=cur,
        to_version=version,
        reason=reason or action,
        verdict=verdict,
        month=month,
    )
    _fenced_move(cfg, arm, entry, version, cur, finish=False)
    set_tags(
        cfg,
        arm,
        version,
        {
            "promoted_from": cur,
            "promoted_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "promoted_reason": reason or action,
            "promoted_by": actor,
            **tags,
        },
    )
    now = _champion(cfg, arm)
    if now != version:  # only a writer outside the lock can cause this
        history.finish(cfg, entry, ok=False, note=f"champion is v{now or 'none'} right after the move")
        raise PromotionRace(
            f"{model_name(arm, cfg)}: champion is v{now or 'none'} right after moving it "
            f"to v{version}: something moved it without the promotion lock"
        )
    history.finish(cfg, entry)
    return {"arm": arm, "champion": version, "previous": cur, "promoted": "true"}


def _fenced_move(cfg: Config, arm: str, entry: str, to_version: str, checked: str, *, finish: bool = True) -> None:
    """Under the lock, with history entry ``entry`` pending: move the champion from ``checked`` to ``to_version``,
    fenced (abpo.arms.promotion_lock.fence: the lock still this holder's and the champion still ``checked`` at the
    call that moves it); a fenced move fails the entry and raises MoveFenced, nothing moved. ``finish``: finish the
    entry after the move (else the caller does, after what it records with the move)."""
    try:
        set_alias(cfg, arm, registry.CHAMPION, to_version, fence=fence(cfg, arm, to_version, checked))
    except MoveFenced as e:
        history.finish(cfg, entry, ok=False, note=str(e)[:4000])
        raise
    if finish:
        history.finish(cfg, entry)


def rollback(cfg: Config, arm: str, *, reason: str = "", actor: str = "") -> dict[str, str]:
    """Put the arm's previous champion back: the one before the current one in the promotion history
    (abpo.arms.history.champion_stack; a hand move since the last entry is recorded first), recorded as a
    ``rollback`` entry and as tags ``rolled_back_at`` / ``rolled_back_to`` on the version that was champion. Refused
    (NotInRegistry, nothing changed) when there is no previous champion or it no longer exists in the registry."""
    from datetime import UTC, datetime

    actor = actor or history.os_actor()
    with promotion_lock(cfg, arm):
        return _rollback_locked(cfg, arm, reason=reason, actor=actor, now=datetime.now(UTC))


def _restore_missing_locked(cfg: Config, arm: str, *, reason: str, actor: str) -> dict[str, str]:
    """Under the lock, for an arm without a champion alias: make the promotion history's last champion the champion
    again, or, when that version no longer exists (deleted), the newest earlier champion of the history that does;
    recorded as a ``rollback`` entry from no champion. NotInRegistry, nothing changed, when the history names no
    champion or every champion it names was deleted."""
    name = model_name(arm, cfg)
    _settle(cfg, arm, "")
    stack = history.champion_stack(history.entries(cfg, arm))
    if not stack:
        raise NotInRegistry(f"{name}: no champion, and its promotion history names none: nothing to roll back to")
    target = next((v for v in reversed(stack) if get_version(cfg, arm, v) is not None), None)
    if target is None:
        raise NotInRegistry(
            f"{name}: no champion, and every champion of its promotion history (v{', v'.join(stack)}) was deleted; "
            "nothing changed (promote a version with `abpo arms promote`)"
        )
    why = f"champion missing: restored the history's last champion v{stack[-1]}" + (
        "" if target == stack[-1] else f" (deleted), its newest earlier champion v{target}"
    )
    entry = history.begin(
        cfg,
        arm,
        action="rollback",
        actor=actor,
        from_version="",
        to_version=target,
        reason=f"{reason}: {why}" if reason else why,
        verdict=_verdict(cfg, arm, target),
    )
    _fenced_move(cfg, arm, entry, target, "")
    return {"arm": arm, "champion": target, "previous": ""}


def _rollback_locked(cfg: Config, arm: str, *, reason: str, actor: str, now) -> dict[str, str]:
    cur = _champion(cfg, arm)
    if not cur:  # the champion version was deleted (or its alias removed) outside abpo: put the history's back
        return _restore_missing_locked(cfg, arm, reason=reason, actor=actor)
    _settle(cfg, arm, cur)
    _record_hand_move(cfg, arm, cur, month="")
    stack = history.champion_stack(history.entries(cfg, arm))
    if len(stack) < 2 or stack[-1] != cur:
        raise NotInRegistry(
            f"{model_name(arm, cfg)}: champion v{cur} has no previous champion in the promotion history "
            f"(experiment {registry.experiment_name(cfg, history.EXPERIMENT)}): nothing to roll back to"
        )
    previous = stack[-2]
    if get_version(cfg, arm, previous) is None:
        raise NotInRegistry(
            f"{model_name(arm, cfg)}: the previous champion v{previous} no longer exists in the registry "
            f"(deleted); nothing changed (promote another version with `abpo arms promote`)"
        )
    entry = history.begin(
        cfg,
        arm,
        action="rollback",
        actor=actor,
        from_version=cur,
        to_version=previous,
        reason=reason or "rollback",
        verdict=_verdict(cfg, arm, previous),
    )
    _fenced_move(cfg, arm, entry, previous, cur, finish=False)
    set_tags(
        cfg,
        arm,
        cur,
        {
            "rolled_back_at": now.isoformat(timespec="seconds"),
            "rolled_back_to": previous,
            "rolled_back_reason": reason or "rollback",
            "rolled_back_by": actor,
        },
    )
    history.finish(cfg, entry)
    return {"arm": arm, "champion": previous, "previous": cur}
