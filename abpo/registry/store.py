"""The tracking store: which MLflow store the config names (redacted), its SQLite schema made once under a lock, a
moved state refused, experiments and runs (one writer at a time on a SQLite store)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import abpo
from abpo.redact import redact, register_uri_secret
from abpo.registry.errors import NamespaceMismatch, RegistryUnavailable, StateMoved, StoreDamaged, StoreFull

if TYPE_CHECKING:
    from abpo.config import Config

MODEL_NAME = "abpo-recommender"
CHALLENGER = "challenger"
CHAMPION = "champion"
log = logging.getLogger("abpo.registry")
_announced: set[str] = set()


def redact_uri(uri: str) -> str:
    """``uri`` with any password replaced by ``***`` (``http://user:secret@host`` -> ``http://user:***@host``): the
    one redaction function, abpo.redact.redact, under the name the registry's callers know."""
    return redact(uri)


# What a tracking server's HTTP calls may take when abpo sets nothing else ($MLFLOW_HTTP_REQUEST_* exported by the
# user win): MLflow's own defaults (a 120 s timeout, 7 retries with backoff factor 2) made `abpo arms status` against
# an unreachable server answer after 4 min 13 s. Here one call fails within about 2 x 5 s (the first retry does not
# back off): a registry that does not answer is RegistryUnavailable, which the DAG's tasks retry with their own
# backoff (abpo.monthly.common.TRANSIENT), so nothing is lost by failing the call sooner. The timeout bounds each
# connect and each wait for the server's next bytes, not a whole transfer: a large artifact upload is not cut off.
HTTP_TIMEOUTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",  # seconds per connect / read
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
}


def bound_http_calls(uri: str) -> None:
    """For a tracking server (``http(s)://``), set :data:`HTTP_TIMEOUTS` in this process's environment, keeping any
    value the user exported; MLflow reads them on every request."""
    if uri.lower().startswith(("http://", "https://")):
        for var, value in HTTP_TIMEOUTS.items():
            os.environ.setdefault(var, value)


def store_line(cfg: Config) -> str:
    """Which MLflow store the config uses and where that came from, e.g. ``MLflow store sqlite:///x.db (from
    $MLFLOW_TRACKING_URI)``: what the commands print and the tasks log."""
    return f"MLflow store {redact_uri(cfg.paths.tracking_uri())} (from {cfg.paths.tracking_uri_source()})"


_initialised: set[str] = set()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def ensure_store(uri: str) -> None:
    """Create (or migrate) a SQLite tracking store's schema under an exclusive lock file beside it
    (``<db>.init.lock``), once per process and store. MLflow creates the schema on a store's first use and that
    migration is not safe against a second process migrating the same new file at the same moment: the loser
    fails on ``table _alembic_tmp_... already exists``, the half-done migration stays behind and the store never
    opens again (seen when an Airflow task and a reader of the store started together). Other stores: nothing to do
    (a server migrates its own)."""
    db = sqlite_path(uri)
    if db is None or uri in _initialised:
        return
    import fcntl

    from mlflow import MlflowClient

    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{db}.init.lock", "a")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise RegistryUnavailable(
            f"{db}.init.lock: cannot create the MLflow store's init lock ({e.strerror or e}); rule: the directory of "
            f"the SQLite store ({db.parent}) must be writable (a read-only state cannot be used)"
        ) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            damaged = integrity_problem(db)
            if damaged is not None:
                raise StoreDamaged(
                    f"{db}: the store cannot be opened: the MLflow store is damaged ({damaged}); rule: a damaged store is "
                    "restored from a backup (or the state's last copy) before any step runs again; not retried: "
                    "every attempt would fail the same way"
                )
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            client.search_experiments(max_results=1)  # the tracking tables (the whole schema, at its head revision)
            client.search_registered_models(max_results=1)  # the registry's store over the same file
        except StoreDamaged:
            raise
        except Exception as e:  # noqa: BLE001 - a store that cannot be opened (corrupt, unreadable) is reported by
            # the first real use, as RegistryUnavailable naming the store and the operation; not here, not twice
            log.debug(f"MLflow store {redact_uri(uri)} not initialised: {type(e).__name__}: {str(e)[:200]}")
            return
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _initialised.add(uri)


def integrity_problem(db: Path) -> str | None:
    """What SQLite's ``PRAGMA quick_check`` finds wrong with the store file ``db`` (its first line), or None when it
    is whole, empty or not there yet (MLflow creates it). quick_check reads every page of the file's b-trees once, a
    fraction of a second for a state's store, so it runs where a process first opens the store (:func:`ensure_store`):
    a truncated file or a corrupted page is refused there, before any step writes into it or reads a wrong answer.
    A store locked by a writer is not judged (the lock says nothing of its pages)."""
    import sqlite3

    try:
        if not db.is_file() or db.stat().st_size == 0:
            return None
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            rows = con.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            return None
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    except OSError:
        return None  # unreadable here: the store's first use reports it, naming the operation
    first = " ".join(str(rows[0][0]).split()) if rows else "no answer"  # its report spans lines: one here
    return None if first == "ok" else f"quick_check: {first[:200]}"


# What SQLite says when the disk under a store is full, and when the store's file is damaged: a retry cannot help
# either (the same write fails again until space is freed; a damaged file stays damaged until it is restored).
FULL_SIGNS = ("database or disk is full",)
DAMAGED_SIGNS = ("database disk image is malformed", "file is not a database", "malformed database schema")


def store_failure(e: BaseException, uri: str = "") -> StoreFull | StoreDamaged | None:
    """The refusal ``e`` (or an exception it was raised from or while handling) amounts to, or None: a full disk
    (SQLite's "database or disk is full", an OSError ENOSPC writing a file: StoreFull naming the file and "free
    space") or a damaged store (SQLite's "malformed" / "not a database": StoreDamaged naming the file and "restore
    it"), each one line, however deep MLflow and SQLAlchemy wrapped it. ``uri``: the tracking store (default: the one
    this process's MLflow points at), named when SQLite does not say which file."""
    import errno

    from abpo.registry.errors import ModelFilesDamaged

    said: ModelFilesDamaged | None = None  # a model log's own one line (it names the file and "free space")
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (StoreFull, StoreDamaged)):
            return cur
        if isinstance(cur, ModelFilesDamaged) and said is None:
            said = cur
        text = str(cur)
        if (isinstance(cur, OSError) and cur.errno == errno.ENOSPC) or "[Errno 28]" in text:
            where = getattr(cur, "filename", None) or _store_file(uri)
            return StoreFull(
                str(said)
                if said is not None
                else f"{where}: no space left on device; rule: free space on the disk that holds it, then run the "
                "step again (a full disk is not retried: every attempt would fail the same way)"
            )
        if any(sign in text for sign in FULL_SIGNS):
            return StoreFull(
                f"{_store_file(uri)}: the MLflow store cannot be written: database or disk is full; rule: free space "
                "on the disk that holds it, then run the step again (a full disk is not retried: every attempt would "
                "fail the same way)"
            )
        sign = next((s for s in DAMAGED_SIGNS if s in text), None)
        if sign is not None:
            return StoreDamaged(
                f"{_store_file(uri)}: the store cannot be opened: the MLflow store is damaged ({sign}); rule: a damaged store is "
                "restored from a backup (or the state's last copy) before any step runs again; not retried: every "
                "attempt would fail the same way"
            )
        cur = cur.__cause__ or cur.__context__
    return None


def _store_file(uri: str = "") -> str:
    """The SQLite file of ``uri`` (default: the store this process's MLflow points at), else the redacted URI."""
    if not uri:
        import mlflow

        uri = mlflow.get_tracking_uri()
    db = sqlite_path(uri)
    return str(db) if db is not None else redact_uri(uri)


def _end_failed_run(run_id: str | None) -> bool:
    """Mark ``run_id`` FAILED after a write to its store failed (a full disk: MLflow's own end of the run may have
    been the write that failed, leaving it RUNNING); True when it is marked (or there is none), False when the store
    refuses that too: the task's next attempt marks it KILLED (abpo.registry.completed_task_run)."""
    from mlflow import MlflowClient

    if run_id is None:
        return True
    try:
        MlflowClient().set_terminated(run_id, status="FAILED")
        return True
    except Exception:  # noqa: BLE001 - the store takes no write at all: said in the refusal
        return False


def refused_write(e: BaseException, run_id: str | None, uri: str) -> StoreFull | StoreDamaged | None:
    """:func:`store_failure` of ``e`` with what became of run ``run_id`` appended (marked FAILED, or left for the next
    attempt to mark KILLED), or None when ``e`` is neither a full disk nor a damaged store. An error already refused
    (raised by a nested run) comes back as it is."""
    failure = store_failure(e, uri)
    if failure is None or failure is e:
        return failure
    if run_id is None:
        return failure
    marked = _end_failed_run(run_id)
    return type(failure)(
        f"{failure}; run {run_id} "
        + ("marked FAILED" if marked else "could not be marked FAILED either: the task's next attempt marks it KILLED")
    )


def moved_from(cfg: Config) -> str | None:
    """The state directory the config's SQLite MLflow store was made in, when that is not ``paths.root`` (a copied or
    restored state), else None. Read from the experiments abpo created (artifact location
    ``<root>/<paths.mlflow_artifacts>/<experiment>``, :func:`_ensure_experiment`); a store other than the state's
    own ``<root>/mlflow.db``, one that does not exist yet, or has no such experiment: None."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    db = sqlite_path(cfg.paths.tracking_uri())
    art = Path(cfg.paths.mlflow_artifacts)
    root = cfg.paths.resolve("root")
    if (
        db is None
        or db != root / "mlflow.db"
        or not db.is_file()
        or art.is_absolute()
        or not isinstance(cfg.paths.location("mlflow_artifacts"), Path)
    ):  # an object store is not under a state
        return None  # only the state's own store (paths.mlflow_tracking_uri unset): a shared store has other states'
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            rows = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
    except sqlite3.Error:
        return None  # not a store (yet): MLflow reports it on first use
    for name, location in rows:
        if not location or not location.startswith("file://"):
            continue
        path = Path(unquote(urlparse(location).path))
        if path.name != name or not path.parent.as_posix().endswith("/" + art.as_posix()):
            continue
        old = Path(path.parent.as_posix()[: -len(art.as_posix()) - 1])
        if old != root and not (old.exists() and old.resolve() == root.resolve()):  # not another spelling of root
            return str(old)
    return None


_checked_moved: set[str] = set()


_ABPO_NAME = re.compile(r"(?:(.+)-)?abpo-(?:arms|promotions|monthly|update|sft|experiment|recommender|arm-[a-z0-9_]+)")
NAMESPACE_RECORD = "namespace.json"  # <paths.root>/namespace.json: {"namespace": "<paths.namespace>"}
_checked_namespace: set[tuple[str, str]] = set()


def _namespace_in_use(cfg: Config) -> str | None:
    """The namespace a state made before :data:`NAMESPACE_RECORD` existed was run with, read from what it holds:
    its own SQLite store's experiments (``<ns>-abpo-arms``, ...) and its models' cache (``<paths.models>/registry/
    <ns>-abpo-arm-<arm>``); None when it holds none of them (a new state)."""
    import sqlite3

    names: list[str] = []
    db = cfg.paths.resolve("root") / "mlflow.db"
    if db.is_file() and db.stat().st_size:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
                names += [n for (n,) in con.execute("SELECT name FROM experiments").fetchall()]
        except sqlite3.Error:
            pass  # not a store: MLflow reports it on first use
    cache = cfg.paths.resolve("models") / "registry"
    if cache.is_dir():
        names += [p.name for p in cache.iterdir() if p.is_dir()]
    found: set[str] = set()
    for name in names:  # abpo's own names: <ns>-abpo-arms, <ns>-abpo-promotions, <ns>-abpo-arm-<arm>, ...
        m = _ABPO_NAME.fullmatch(name)
        if m:
            found.add(m.group(1) or "")
    return sorted(found)[0] if len(found) == 1 else (None if not found else ",".join(sorted(found)))


def check_namespace(cfg: Config) -> None:
    """The state records the environment it belongs to (``<paths.root>/namespace.json``, written on its first use)
    and refuses to run under another: NamespaceMismatch naming both when ``paths.namespace`` (``$ABPO_NAMESPACE``)
    differs from the recorded one. A state made before the record existed is judged by the names it holds
    (:func:`_namespace_in_use`) and then records its namespace. Once per process and (state, namespace)."""
    import json

    root = cfg.paths.resolve("root")
    ns = cfg.paths.namespace or ""
    if (str(root), ns) in _checked_namespace:
        return
    record = root / NAMESPACE_RECORD
    how = "recorded in " + str(record)
    try:
        recorded = json.loads(record.read_text())["namespace"] if record.is_file() else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NamespaceMismatch(
            f"{record}: unreadable ({type(e).__name__}: {e}); rule: the state's namespace record is "
            '{"namespace": "<paths.namespace>"}; restore it (or remove it to let the next run record its namespace)'
        ) from None
    if recorded is None:
        recorded, how = _namespace_in_use(cfg), f"found in the state's MLflow store and model cache under {root}"
    if recorded is not None and recorded != ns:
        shown = lambda n: f"{n!r}" if n else "'' (no namespace)"  # noqa: E731
        raise NamespaceMismatch(
            f"state {root} belongs to namespace {shown(recorded)} ({how}), not {shown(ns)} (paths.namespace / "
            "$ABPO_NAMESPACE); rule: a state runs only in the environment it was made in, else it would serve, "
            "promote and write the history of the other environment's models: set ABPO_NAMESPACE="
            f"{recorded} (or use that environment's own state directory)"
        )
    if not record.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f".{NAMESPACE_RECORD}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"namespace": ns}) + "\n")
        os.replace(tmp, record)
    _checked_namespace.add((str(root), ns))


_configured: dict[str, tuple[str, str, str, str]] = {}  # "key": the store this process last pointed MLflow at


def configure(cfg: Config) -> str:
    """Point MLflow at the config's tracking store (creating the local SQLite store and artifact root), after checking
    that the state belongs to the config's namespace (:func:`check_namespace`). The first time a process uses a
    store, one log line says which one and where it came from (:func:`store_line`).

    ``mlflow.set_tracking_uri`` also writes MLFLOW_TRACKING_URI (and set_registry_uri MLFLOW_REGISTRY_URI) into this
    process's environment; both are put back to what the user exported, so a subprocess started later (with another
    state directory, say) never mistakes this process's choice for the user's.

    Once per process and store: every registry function that takes ``cfg`` calls it, and a repeat for the store MLflow
    already points at (same tracking URI, state directory, namespace and artifact root, the state directory still
    there) returns at once. Nothing outside abpo.registry calls it (a test may, to point MLflow at a store)."""
    import mlflow

    uri = cfg.paths.tracking_uri()
    root, ns = str(cfg.paths.resolve("root")), cfg.paths.namespace or ""
    key = (uri, root, ns, str(cfg.paths.location("mlflow_artifacts")))
    if (
        _configured.get("key") == key
        and mlflow.get_tracking_uri() == uri
        and mlflow.get_registry_uri() == uri
        and uri in _announced  # each check and the store line below still stand as this process made them
        and (root, ns) in _checked_namespace
        and (not uri.startswith("sqlite:///") or (uri in _checked_moved and Path(root).is_dir()))
    ):
        return uri
    register_uri_secret(uri)  # its password is blanked out of every message and log line from here on
    bound_http_calls(uri)
    check_namespace(cfg)  # never into another environment's names
    if uri.startswith("sqlite:///") and uri not in _checked_moved:  # once per process and store
        old = moved_from(cfg)
        if old is not None:
            raise StateMoved(
                f"{sqlite_path(uri)}: the MLflow store's artifact locations are under {old}, not under "
                f"paths.root = {cfg.paths.resolve('root')}; rule: a moved state is relocated before use "
                f'(`abpo state relocate --from {old}`, docs/operations.md "Moving a state"), else its '
                "runs would write into the old directory"
            )
        _checked_moved.add(uri)
    if uri.startswith("sqlite:///"):
        cfg.paths.resolve("root").mkdir(parents=True, exist_ok=True)
        artifacts = cfg.paths.location("mlflow_artifacts")
        if isinstance(artifacts, Path):
            artifacts.mkdir(parents=True, exist_ok=True)
        else:  # an object store (s3://bucket/prefix): MLflow writes through boto3 with the environment's credentials
            from abpo.data import storage

            storage.apply_connection()  # $ABPO_STORAGE_CONNECTION's credentials, when it names one
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    ensure_store(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for var, user in (
        ("MLFLOW_TRACKING_URI", abpo.USER_MLFLOW_TRACKING_URI),
        ("MLFLOW_REGISTRY_URI", abpo.USER_MLFLOW_REGISTRY_URI),
    ):
        if user:
            os.environ[var] = user
        else:
            os.environ.pop(var, None)
    if uri not in _announced:
        _announced.add(uri)
        log.info(store_line(cfg))
    _configured["key"] = key
    return uri


def experiment_name(cfg: Config, experiment: str) -> str:
    """The MLflow experiment of base name ``experiment`` (abpo-arms, update.mlflow_experiment, ...) in the config's
    environment: ``<paths.namespace>-<experiment>``, or ``experiment`` itself without a namespace."""
    from abpo.paths import namespaced

    return namespaced(experiment, cfg.paths.namespace)


def model_name(cfg: Config) -> str:
    """The registered model of pi_init (:data:`MODEL_NAME`) in the config's environment (``paths.namespace``)."""
    from abpo.paths import namespaced

    return namespaced(MODEL_NAME, cfg.paths.namespace)


def _ensure_experiment(cfg: Config, experiment: str) -> str:
    """The id of experiment ``experiment`` (a base name: namespaced here, :func:`experiment_name`), created with an
    artifact root under the state when the store is the default SQLite file."""
    import mlflow

    configure(cfg)
    experiment = experiment_name(cfg, experiment)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if cfg.paths.tracking_uri().startswith("sqlite:///"):
        artifacts = cfg.paths.location("mlflow_artifacts")
        location = (
            (artifacts / experiment).as_uri()
            if isinstance(artifacts, Path)
            else f"{artifacts.rstrip('/')}/{experiment}"
        )
    return mlflow.create_experiment(experiment, artifact_location=location)


@contextlib.contextmanager
def start_run(
    cfg: Config, experiment: str, run_name: str, tags: dict[str, Any] | None = None, nested: bool = False
) -> Iterator[Any]:
    """Open an MLflow run in ``experiment`` (created with a local artifact root if needed).

    Records the config's name and seed as tags so every run says how it was made; a task's run (tagged with its task
    key) also names the process of its attempt (abpo.registry.attempts), so that another attempt supersedes it only
    once that process is gone.
    """
    import mlflow

    from abpo.registry import attempts

    configure(cfg)
    exp_id = _ensure_experiment(cfg, experiment)
    all_tags = {"abpo.config": cfg.name, "abpo.seed": str(cfg.seed)}
    all_tags.update({k: str(v) for k, v in (tags or {}).items()})
    if attempts.TASK_KEY_TAG in all_tags:
        all_tags[attempts.ATTEMPT_TAG] = attempts.this_process()
    run_id = None
    try:
        with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=all_tags, nested=nested) as run:
            run_id = run.info.run_id
            yield run
    except Exception as e:
        refused = refused_write(e, run_id, cfg.paths.tracking_uri())
        if refused is e:
            raise
        if refused is not None:
            raise refused from e
        if not store_locked(e):
            raise
        marked = _end_locked_run(run_id)
        first = next((line.strip() for line in str(e).splitlines() if "locked" in line), "database is locked")
        raise RegistryUnavailable(
            f"{redact_uri(cfg.paths.tracking_uri())}: the MLflow store is locked by another writer ({first[:200]}); "
            f"rule: one writer at a time, retry when it has finished; run {run_id or '(not started)'} "
            + (
                "marked FAILED"
                if marked
                else "could not be marked FAILED either: the task's next attempt marks it KILLED"
            )
        ) from e


def store_locked(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it wraps) is SQLite's "database is locked": another process holds the store's
    write lock longer than the busy timeout."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if "database is locked" in str(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _end_locked_run(run_id: str | None, attempts: int = 10, pause: float = 1.0) -> bool:
    """Mark ``run_id`` FAILED once the store's lock is free (``attempts`` tries, ``pause`` s apart), so a run that
    failed on a locked store is not left RUNNING; True when marked (MLflow's own end of the run, which failed on the
    same lock, has already taken it off its active-run stack)."""
    import time

    from mlflow import MlflowClient

    if run_id is None:
        return True
    for i in range(attempts):
        try:
            MlflowClient().set_terminated(run_id, status="FAILED")
            return True
        except Exception as e:  # noqa: BLE001 - still locked: wait; anything else: give up (the next attempt cleans up)
            if not store_locked(e) or i == attempts - 1:
                return False
            time.sleep(pause)
    return False
