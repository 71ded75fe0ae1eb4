"""The console view of abpo's logging: every module logs through ``logging.getLogger(__name__)`` (loggers under
``abpo``); :func:`console` shows their INFO records as plain lines on stdout, which is what the ``abpo`` command,
the Airflow tasks and ``abpo demo`` print. Worker processes hand their records to the parent
(:func:`from_workers`), so a pool's lines go wherever the parent's go. Every record, abpo's and its libraries', is
redacted when it is made (:func:`redact_records`: no password or secret in a log line). A leaf module: it imports
nothing of abpo but the redaction (abpo.redact)."""

from __future__ import annotations

import contextlib
import functools
import logging
import logging.handlers
import sys
from collections.abc import Callable, Iterator
from typing import Any

from abpo.redact import redact

ROOT = "abpo"


def redact_records() -> None:
    """Make every log record of this process with its message redacted (abpo.redact.redact: a URI's password, a known
    secret): a record factory, so the console, a task log and any handler a deployment adds get the redacted text.
    Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "abpo_redacts", False):
        return

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report, as it would be unredacted
            return record
        clean = redact(text)
        if clean != text:
            record.msg, record.args = clean, None
        return record

    make.abpo_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)


class _Stdout(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stdout`` is when a record is emitted (a test's capture, Airflow's
    task output), like ``print`` does."""

    abpo_console = True
    to_stderr = False  # console(stderr=True): a command whose stdout is data (`abpo arms history --json`)

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr if self.to_stderr else sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ / setStream assign it; the property always wins
        pass


def console(prefix: str = "", *, propagate: bool = True, stderr: bool = False) -> logging.Handler:
    """Show the ``abpo`` loggers' INFO records on stdout (on stderr with ``stderr``: a command that prints data, such
    as JSON, on stdout), one plain line each (``prefix`` before every line: the
    demo marks the tasks' lines with it to pick them out of Airflow's output). ``propagate=False``: the records go
    only there, not also to the root logger's handlers (inside an Airflow task those write the task log too, which
    would then hold every line twice). Idempotent: a second call only updates the prefix and propagation. Progress
    bars are turned off unless stderr is a terminal (:func:`progress_bars_only_on_a_terminal`); records are
    redacted (:func:`redact_records`)."""
    progress_bars_only_on_a_terminal()
    redact_records()
    logger = logging.getLogger(ROOT)
    logger.propagate = propagate
    handler = next((h for h in logger.handlers if getattr(h, "abpo_console", False)), None)
    if handler is None:
        handler = _Stdout()
        logger.addHandler(handler)
    if isinstance(handler, _Stdout):
        handler.to_stderr = stderr
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    handler.setLevel(logging.INFO)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


def task_logging(prefix: str = "") -> None:
    """The ``abpo`` loggers inside an Airflow task: every INFO record reaches the task log once. Without ``prefix``
    (a deployment) the records propagate to the root logger, whose handler Airflow set up to write the task log
    with the record's level and logger name, and no stdout handler is added (Airflow copies a task's stdout into
    its log too: a second copy of each line). With ``prefix`` (``abpo demo``: $ABPO_CONSOLE_PREFIX) the lines go to
    stdout marked with it, for the demo to pick out, and do not propagate. Progress bars are off unless stderr is
    a terminal: Airflow logs a task's stderr at ERROR level. Records are redacted (:func:`redact_records`)."""
    progress_bars_only_on_a_terminal()
    redact_records()
    logger = logging.getLogger(ROOT)
    if prefix:
        console(prefix, propagate=False)
        return
    for h in [h for h in logger.handlers if getattr(h, "abpo_console", False)]:  # an earlier console() call's
        logger.removeHandler(h)
    logger.propagate = True
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


# The switches of the progress bars abpo's dependencies draw (tqdm, Hugging Face Hub / transformers / datasets,
# MLflow's artifact downloads): each library reads its variable when it is imported (tqdm >= 4.66: every TQDM_*
# variable is a default argument of tqdm()) or when it draws a bar; a value the user set is kept.
PROGRESS_BAR_SWITCHES = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def progress_bars_only_on_a_terminal(stream: Any = None) -> bool:
    """Turn progress bars off when ``stream`` (default ``sys.stderr``, where they are drawn) is not an interactive
    terminal: a pipe, a file, an Airflow task's log (which records stderr at ERROR level, so each redraw would be an
    ERROR line). Sets :data:`PROGRESS_BAR_SWITCHES` in the environment (unless already set) and, for libraries
    already imported, their own switch. Returns whether bars were turned off."""
    import os

    stream = sys.stderr if stream is None else stream
    try:
        interactive = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real stream
        interactive = False
    if interactive:
        return False
    for k, v in PROGRESS_BAR_SWITCHES.items():
        os.environ.setdefault(k, v)
    std = getattr(sys.modules.get("tqdm.std"), "tqdm", None)  # tqdm read TQDM_* when imported: its default, now
    init = getattr(std, "__dict__", {}).get("__init__")
    if isinstance(init, functools.partialmethod) and "disable" not in init.keywords:
        std.__init__ = functools.partialmethod(init.func, *init.args, **{**init.keywords, "disable": True})
    if "transformers" in sys.modules:  # it read HF_HUB_DISABLE_PROGRESS_BARS when imported
        with contextlib.suppress(Exception):
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        with contextlib.suppress(Exception):
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
    return True


@contextlib.contextmanager
def quiet(name: str = ROOT):
    """Hide the INFO records of logger ``name`` (and its children) for the block (warnings still show)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


def _to_queue(queue: Any, level: int) -> None:
    """A pool worker's initializer: its ``abpo`` records at ``level`` and above go to ``queue``, nowhere else."""
    logger = logging.getLogger(ROOT)
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.addHandler(logging.handlers.QueueHandler(queue))
    logger.setLevel(level)
    logger.propagate = False


class _ToLoggers(logging.handlers.QueueListener):
    """Handles each record a worker sent as if this process had logged it: through the logger of the same name, so
    its handlers, levels and filters apply (the console's prefix, a test's caplog)."""

    def handle(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


@contextlib.contextmanager
def from_workers(mp_context: Any) -> Iterator[tuple[Callable[..., None], tuple[Any, ...]]]:
    """``(initializer, initargs)`` for a process pool of ``mp_context``: its workers' ``abpo`` records are handled by
    this process's loggers while the block runs. A spawned worker starts with no logging set up, so without it their
    lines would be lost (or, printed directly, miss the console's prefix and a test's capture)."""
    queue = mp_context.Queue()
    listener = _ToLoggers(queue)
    listener.start()
    try:
        yield _to_queue, (queue, logging.getLogger(ROOT).getEffectiveLevel())
    finally:
        listener.stop()


class _Tee:
    """A text stream that writes to several: the console and a step log (``abpo demo -v``)."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            with contextlib.suppress(Exception):
                s.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ...: the console's
        return getattr(self.streams[0], name)

    def isatty(self) -> bool:  # what a progress bar asks: the console's answer
        try:
            return bool(self.streams[0].isatty())
        except (AttributeError, ValueError):
            return False


def _console_streams() -> list[Any]:
    return [s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None]


def _handlers_on(streams: list[Any]) -> list[logging.StreamHandler]:
    """Every logging handler of this process that writes to one of ``streams`` (the console's, or a step log's): the
    root logger's and each library's own (transformers binds its handler to the stderr of the moment it was
    imported). Not abpo's console handler, which writes to whatever ``sys.stdout`` is, nor a file handler."""
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    found: dict[int, logging.StreamHandler] = {}
    for logger in loggers:
        for h in logger.handlers:
            if (
                isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and not getattr(h, "abpo_console", False)
                # a handler whose stream is a property (logging's last-resort handler) writes to whatever
                # sys.stderr is, which the step log redirects already; it cannot be rebound
                and not isinstance(getattr(type(h), "stream", None), property)
                and any(h.stream is s for s in streams)
            ):
                found[id(h)] = h
    return list(found.values())


@contextlib.contextmanager
def step_log(path: Any, *, echo: bool = False) -> Iterator[Any]:
    """For the block, the console's chatter goes to the file ``path`` (appended), not the console: whatever this
    process prints on stdout or stderr (transformers' Trainer prints each logged step as a dict; MLflow's loggers
    write to the stderr of the moment: "Creating initial MLflow database tables..."; Python's warnings, such as
    Airflow's about graphviz), every library handler bound to the console, and abpo's own lines. abpo's warnings
    and errors still reach the console as well. With ``echo`` everything also stays on the console (``abpo demo
    -v``). Progress bars are off in the block unless ``echo`` and a terminal (they would redraw into the file).
    Output written by C code or a child process to the file descriptors themselves is not redirected. Yields the
    console's stdout, for the lines meant for it."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out, err = sys.stdout, sys.stderr
    with path.open("a", encoding="utf-8") as file:
        new_out, new_err = (_Tee(out, file), _Tee(err, file)) if echo else (file, file)
        handlers = _handlers_on(_console_streams())
        before = [(h, h.stream) for h in handlers]
        for h, stream in before:
            h.stream = _Tee(stream, file) if echo else file  # not setStream: it flushes into a closed capture
        warnings_to_console = None
        if not echo:
            warnings_to_console = _FixedStream(out)
            warnings_to_console.setLevel(logging.WARNING)
            logging.getLogger(ROOT).addHandler(warnings_to_console)
        sys.stdout, sys.stderr = new_out, new_err
        progress_bars_only_on_a_terminal(new_err)
        try:
            yield out
        finally:
            sys.stdout, sys.stderr = out, err
            for h, stream in before:
                h.stream = stream
            # a library first imported in the block bound its handler to the step log, which closes now: the console's
            for h in _handlers_on([file, new_out, new_err]):
                h.stream = err
            if warnings_to_console is not None:
                logging.getLogger(ROOT).removeHandler(warnings_to_console)
            file.flush()


class _FixedStream(logging.StreamHandler):
    """abpo's warnings on the console while :func:`step_log` sends its other lines to the file: ``WARNING: ...``."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
