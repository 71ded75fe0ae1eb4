"""The promotion history: every champion move of every arm (by the gate, a refit, `abpo arms promote`, a rollback, a
bootstrap, or by hand in MLflow), and every governance decision beside them (pin, unpin, a promotion refused because
the arm is pinned or its champion moved during the month), append-only, in the registry itself: one MLflow run per
entry in experiment ``abpo-promotions``, its fields as run *params*.

Why runs and params: every worker (the CLI, each Airflow worker, on any machine) talks to the same tracking store, so
the history is where the champion is, not in a local file; MLflow refuses to change a logged param (a second
``log_param`` with another value fails), so an entry once written cannot be rewritten through the API; entries are
numbered (``seq``, one sequence per arm) and written only under the arm's promotion lock
(abpo.arms.promotion_lock.promotion_lock), so two writers never take the same number.

One recorded step: a move is written as a *pending* entry (a RUNNING run, all its params logged) before the alias
moves, and finished (run FINISHED) after. A mover that died in between leaves a pending entry; the next writer
under the lock settles it (:func:`settle_pending`): FINISHED when the champion is the entry's ``to`` (the move
happened), FAILED otherwise. Only FINISHED entries are history.

Fields (all strings): ``seq``, ``arm``, ``action`` (bootstrap | refit | gate | promote | rollback | mlflow-ui |
baseline | adopt | pin | unpin | not-promoted), ``actor`` (the OS user or ``--actor``, ``gate``, ``abpo`` for
automatic steps, ``mlflow-ui`` for a move made outside abpo), ``at`` (UTC, ISO 8601), ``from`` and ``to`` (versions;
equal for an entry that moved nothing), ``reason``, ``verdict`` (the gate's, when one was recorded on ``to``),
``month``."""

from __future__ import annotations

import dataclasses
import getpass
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import names

if TYPE_CHECKING:
    from abpo.config import Config

EXPERIMENT = "abpo-promotions"
# actions that move the champion (the others record a decision and leave it where it was)
MOVES = ("bootstrap", "refit", "gate", "promote", "rollback", "mlflow-ui", "adopt")
ACTIONS = (*MOVES, "baseline", "pin", "unpin", "not-promoted")
FIELDS = ("seq", "arm", "action", "actor", "at", "from", "to", "reason", "verdict", "month")
ARM_TAG, SEQ_TAG, STATE_TAG = "abpo.arm", "abpo.seq", "abpo.history"


@dataclasses.dataclass(frozen=True)
class Entry:
    seq: int
    arm: str
    action: str
    actor: str
    at: str
    from_version: str
    to_version: str
    reason: str = ""
    verdict: str = ""
    month: str = ""
    run_id: str = ""

    @property
    def moved(self) -> bool:
        return self.action in MOVES and self.from_version != self.to_version

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "arm": self.arm,
            "action": self.action,
            "actor": self.actor,
            "at": self.at,
            "from": self.from_version,
            "to": self.to_version,
            "reason": self.reason,
            "verdict": self.verdict,
            "month": self.month,
        }

    def line(self) -> str:
        """The entry as one line of `abpo arms history`: arm, seq, when, action, the move, who, why (its first 160
        characters), the month and the gate's verdict (its first 80)."""
        move = (
            f"v{self.from_version or '-'} -> v{self.to_version}"
            if self.from_version != self.to_version
            else f"v{self.to_version}"
        )
        extra = "".join(f" {k} {v}" for k, v in (("month", self.month), ("verdict", self.verdict[:80])) if v)
        return (
            f"{self.arm:<11} #{self.seq:<4} {self.at}  {self.action:<12} {move:<14} by {self.actor}: "
            f"{self.reason[:160]}{extra}"
        )


class HistoryFieldRefused(ValueError):
    """A ``--reason`` or ``--actor`` (or $ABPO_ACTOR) holding a control character: a newline or carriage return would
    print as a separate, forged history entry; NUL and the bidirectional controls (right-to-left override) make the
    printed line say something other than what was recorded."""


# the bidirectional formatting characters (Unicode's Bidi_Control): they reorder how the rest of a line is shown
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
MAX_ACTOR_LENGTH = 200


def check_text_field(field: str, value: str) -> str:
    """``value`` when it may be recorded as history field ``field`` (``reason``, ``actor``): no control character
    (Unicode category Cc: newline, carriage return, tab, NUL, escape, ...), no line or paragraph separator (U+2028,
    U+2029) and no bidirectional control (:data:`BIDI_CONTROLS`); an actor at most :data:`MAX_ACTOR_LENGTH`
    characters. HistoryFieldRefused naming the field, the character and its position otherwise."""
    import unicodedata

    for i, ch in enumerate(str(value)):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in BIDI_CONTROLS:
            name = unicodedata.name(ch, "") or "a control character"
            raise HistoryFieldRefused(
                f"{field} {value[:80]!r}: character {i + 1} is U+{ord(ch):04X} ({name}); rule: a history field is one "
                "line of printable text (no newline, carriage return, tab, NUL or other control character, no "
                "bidirectional override), so every entry prints as the one line it is; nothing recorded"
            )
    if field == "actor" and len(value) > MAX_ACTOR_LENGTH:
        raise HistoryFieldRefused(
            f"actor {value[:40]!r}...: {len(value)} characters; rule: at most {MAX_ACTOR_LENGTH}; nothing recorded"
        )
    return value


def os_actor() -> str:
    """Who runs this process: $ABPO_ACTOR, else the OS user (getpass), else "unknown"."""
    who = os.environ.get("ABPO_ACTOR", "").strip()
    if who:
        return who
    try:
        return getpass.getuser() or "unknown"
    except (OSError, KeyError):
        return "unknown"


def _runs(cfg: Config, arm: str) -> list:
    """Every run of the arm's history (any status)."""
    return runs_of(registry.tracking_client(cfg), _experiment_id(cfg), arm)


def _experiment_id(cfg: Config) -> str:
    return registry._ensure_experiment(cfg, EXPERIMENT)


def read(client, arm: str, experiment: str = EXPERIMENT) -> list[Entry]:
    """The arm's history read with an MlflowClient (the UI plugin's, on its own tracking URI), oldest first; [] when
    the experiment does not exist yet. Creates nothing. ``experiment``: the history's experiment as named in the
    store, i.e. with the environment's namespace (registry.experiment_name(cfg, EXPERIMENT); abpo.paths.namespaced)."""
    exp = registry.experiment_id(client, experiment)
    if exp is None:
        return []
    runs = [r for r in runs_of(client, exp, arm) if r.info.status == "FINISHED" and "seq" in r.data.params]
    return sorted((_entry(r) for r in runs), key=lambda e: e.seq)


def runs_of(client, experiment_id: str, arm: str) -> list:
    """Every run (any status) of the arm's history in experiment ``experiment_id``."""
    return registry.tagged_runs(client, experiment_id, ARM_TAG, names.check_arm(arm))


def _entry(run) -> Entry:
    p = run.data.params
    return Entry(
        seq=int(p["seq"]),
        arm=p["arm"],
        action=p["action"],
        actor=p["actor"],
        at=p["at"],
        from_version=p.get("from", ""),
        to_version=p.get("to", ""),
        reason=p.get("reason", ""),
        verdict=p.get("verdict", ""),
        month=p.get("month", ""),
        run_id=run.info.run_id,
    )


def entries(cfg: Config, arm: str) -> list[Entry]:
    """The arm's history, oldest first (finished entries only). RegistryUnavailable naming the store when the
    registry cannot answer (a server down, a store that cannot be opened): never read as an empty history."""
    try:
        client = registry.tracking_client(cfg)
        return read(client, arm, registry.experiment_name(cfg, EXPERIMENT)) if _experiment_id(cfg) else []
    except (registry.RegistryUnavailable, registry.StateMoved, registry.NamespaceMismatch):
        raise  # the registry's own refusals (a moved state, another namespace) stand as they are
    except Exception as e:  # noqa: BLE001 - MlflowException (a server down), or the store cannot be opened at all
        text = str(e).splitlines()[0][:300] if str(e) else ""
        why = "" if registry.is_mlflow_error(e) else ": the store cannot be opened"
        raise registry.RegistryUnavailable(
            f"MLflow registry {cfg.paths.tracking_uri()}: could not read the promotion history of arm {arm!r} "
            f"(experiment {registry.experiment_name(cfg, EXPERIMENT)}){why} ({type(e).__name__}: {text})"
        ) from e


def pending(cfg: Config, arm: str) -> list[Entry]:
    """The arm's entries left pending, oldest first: written before a move and not finished after it (its writer is
    moving the alias now, or died in between: the next writer under the lock settles it, :func:`settle_pending`).
    [] when the history does not exist yet; creates nothing."""
    client = registry.tracking_client(cfg)
    exp = registry.experiment_id(client, registry.experiment_name(cfg, EXPERIMENT))
    if exp is None:
        return []
    runs = [r for r in runs_of(client, exp, arm) if r.info.status == "RUNNING" and "seq" in r.data.params]
    return sorted((_entry(r) for r in runs), key=lambda e: e.seq)


def last_move(cfg: Config, arm: str) -> Entry | None:
    """The last entry that set the champion (a move, or the baseline recorded when the history started)."""
    moves = [e for e in entries(cfg, arm) if e.action in MOVES or e.action == "baseline"]
    return moves[-1] if moves else None


def begin(
    cfg: Config,
    arm: str,
    *,
    action: str,
    actor: str,
    from_version: str,
    to_version: str,
    reason: str = "",
    verdict: str = "",
    month: str = "",
) -> str:
    """Write entry number (last + 1) as pending (a RUNNING run with every field logged); returns its run id. Call
    only under the arm's promotion lock."""
    if action not in ACTIONS:
        raise ValueError(f"promotion history: action {action!r}; rule: one of {list(ACTIONS)}")
    check_text_field("actor", actor or "")
    check_text_field("reason", reason or "")
    seqs = [int(r.data.params["seq"]) for r in _runs(cfg, arm) if "seq" in r.data.params]
    seq = max(seqs, default=0) + 1
    fields = {
        "seq": str(seq),
        "arm": arm,
        "action": action,
        "actor": actor or "unknown",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "from": str(from_version or ""),
        "to": str(to_version or ""),
        "reason": (reason or "")[:5900],
        "verdict": (verdict or "")[:5900],
        "month": str(month or ""),
    }
    return registry.create_run(
        cfg,
        _experiment_id(cfg),
        run_name=f"{arm}-{seq:05d}-{action}",
        tags={ARM_TAG: arm, SEQ_TAG: str(seq), STATE_TAG: "pending"},
        params=fields,
    )


def finish(cfg: Config, run_id: str, *, ok: bool = True, note: str = "") -> None:
    """Close a pending entry: FINISHED (it happened: part of the history) or FAILED (it did not)."""
    registry.terminate_run(
        run_id,
        "FINISHED" if ok else "FAILED",
        tags={STATE_TAG: ("done" if ok else "failed") + (f": {note}" if note else "")},
    )


def record(cfg: Config, arm: str, **fields: Any) -> Entry:
    """Write one entry and finish it at once (nothing to move, or the move already happened)."""
    run_id = begin(cfg, arm, **fields)
    finish(cfg, run_id)
    return _entry(registry.get_run(run_id))


def settle_pending(cfg: Config, arm: str, champion: str) -> list[str]:
    """Entries left pending by a mover that died between writing and finishing them: FINISHED when the champion is
    their ``to`` (the move happened), FAILED otherwise. Call under the arm's promotion lock (no live writer then).
    Returns what was done, one line each."""
    done = []
    for r in sorted(_runs(cfg, arm), key=lambda r: int(r.data.params.get("seq", 0))):
        if r.info.status != "RUNNING":
            continue
        e = _entry(r) if "seq" in r.data.params and "action" in r.data.params else None
        ok = e is not None and (e.to_version == str(champion) if e.action in MOVES else True)
        finish(cfg, r.info.run_id, ok=ok, note="settled by the next writer (its writer died before finishing)")
        done.append(f"entry {r.data.tags.get(SEQ_TAG, '?')} {'finished' if ok else 'failed'}")
    return done


def champion_stack(history: list[Entry]) -> list[str]:
    """The champions in force, oldest first, replaying the history: a move pushes its ``to``, a rollback pops back
    to its ``to``. The last is the recorded champion; the one before it is where a rollback goes."""
    stack: list[str] = []
    for e in history:
        if e.action == "baseline":
            stack = [e.to_version]
        elif e.action == "rollback":
            while stack and stack[-1] != e.to_version:
                stack.pop()
            if not stack:
                stack = [e.to_version]
        elif e.action in MOVES and e.to_version and (not stack or stack[-1] != e.to_version):
            stack.append(e.to_version)
    return stack


class ChampionMissing(LookupError):
    """The arm has no champion alias although its promotion history names one (the champion version was deleted, or
    its alias removed, outside abpo): bootstrapping it again would silently start the arm over (an LLM arm from
    pi_init, with no gate), dropping its months of updates. A refusal; `abpo arms rollback` restores the history's
    champion (or, when that version is gone, the one before it that still exists)."""


def require_champion_or_none_recorded(cfg: Config, arm: str, model: str) -> None:
    """For an arm without a champion alias (``model``: its registered model, for the message): nothing when its
    history names no champion (a new arm: bootstrap gives it one); ChampionMissing naming the history's last
    champion, the entry that made it and the way back otherwise."""
    history = entries(cfg, arm)
    stack = champion_stack(history)
    if not stack:
        return
    last = next(
        e for e in reversed(history) if e.to_version == stack[-1] and (e.action in MOVES or e.action == "baseline")
    )
    raise ChampionMissing(
        f"{model}: no champion, but its promotion history's last champion is v{stack[-1]} (entry #{last.seq}, "
        f"{last.action} by {last.actor} at {last.at}); rule: an arm whose history names a champion is never "
        "bootstrapped again (its months of updates would be dropped): restore it with `abpo arms rollback --arm "
        f"{arm}` (back to v{stack[-1]}, or to the newest earlier champion that still exists) or `abpo arms promote "
        f"--arm {arm} --version N`; nothing was registered"
    )
