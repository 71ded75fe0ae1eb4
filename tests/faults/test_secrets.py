"""Secrets never printed (issue 48, item 4): a password planted in the tracking URI, in an object-store URI or in the
environment appears in no message of the `abpo` command's error paths (stdout, stderr, --debug tracebacks, log
lines), an object-store URI with credentials is refused when the config loads, and a tracking server that does not
answer is one line within 30 s (abpo bounds MLflow's HTTP timeout and retries)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECRET = "Pl4ntedS3cretXYZ"  # the planted password / key: must appear nowhere in what abpo prints


def _abpo_process(*argv: str, env: dict[str, str], timeout: float = 120) -> tuple[int, str, str, float]:
    """`abpo ARGV` as its own process (as a user runs it): (rc, stdout, stderr, seconds)."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "abpo.cli", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return out.returncode, out.stdout, out.stderr, time.monotonic() - start


@pytest.fixture
def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers (a tracking server that hangs): its
    port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(timeout=5)
    for c in held:
        c.close()
    srv.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_tracking_server_is_one_line_within_30_s_and_no_password(state, silent_server):
    env = {
        **os.environ,
        "ABPO_STATE": str(state),
        "ABPO_TRACKING_URI": f"http://alice:{SECRET}@127.0.0.1:{silent_server}/",
    }
    for var in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        env.pop(var, None)
    rc, out, err, seconds = _abpo_process("arms", "status", env=env)
    assert seconds < 30, (seconds, err[-2000:])
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "abpo arms status: MLflow registry http://alice:***@127.0.0.1" in err, err
    assert SECRET not in out + err


@pytest.mark.parametrize(
    "argv",
    [
        ("arms", "status"),
        ("arms", "status", "--debug"),
        ("arms", "pin", "--arm", "abpo", "--reason", "freeze"),
        ("arms", "history"),
        ("arms", "history", "--json"),
        ("arms", "promote", "--arm", "abpo", "--version", "2"),
        ("arms", "rollback", "--arm", "abpo"),
        ("config",),
    ],
)
def test_a_tracking_password_is_in_no_message_of_the_cli(abpo, state, monkeypatch, argv):
    """Every command that talks to the registry, on a server that refuses connections, in-process (what it prints
    and what it logs), with --debug's traceback too; `abpo config` prints the URI redacted."""
    monkeypatch.setenv("ABPO_TRACKING_URI", f"http://alice:{SECRET}@127.0.0.1:{_closed_port()}/")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "EnvPl4ntedKey0000")
    # pin and rollback take the promotion lock, which rides out a failing registry for LOCK_WAIT_S (30 s) before its
    # one line (RegistryUnavailable: "could not take the promotion lock"); the same line after 1 s
    monkeypatch.setattr("abpo.arms.promotion_lock.LOCK_WAIT_S", 1.0)
    rc, out, err = abpo(*argv)
    assert SECRET not in out + err and "EnvPl4ntedKey0000" not in out + err, out + err
    if argv == ("config",):
        assert rc == 0 and "http://alice:***@127.0.0.1" in out
    else:
        assert rc == 2 and "alice:***@" in err, err
        if "--debug" not in argv:  # (history --json logs the store line on stderr too: its stdout is JSON)
            lines = [line for line in err.strip().splitlines() if not line.startswith("MLflow store ")]
            assert "Traceback" not in err and len(lines) == 1, err
        if argv[1] in ("pin", "rollback"):
            assert "could not take the promotion lock" in err, err


def test_a_database_store_password_is_in_no_message(abpo, state, monkeypatch):
    monkeypatch.setenv("ABPO_TRACKING_URI", f"postgresql://bob:{SECRET}@127.0.0.1:{_closed_port()}/mlflow")
    for argv in (("arms", "status"), ("arms", "history"), ("arms", "status", "--debug")):
        rc, out, err = abpo(*argv)
        assert rc == 2 and SECRET not in out + err and "bob:***@" in err, err


@pytest.mark.parametrize(
    "setting",
    [
        f"paths.landing=s3://AKIAEXAMPLE:{SECRET}@bucket/landing",
        f"paths.mlflow_artifacts=s3://bucket/artifacts?access_key=AKIAEXAMPLE&secret_key={SECRET}",
        f"data.dataset_dir=s3://AKIAEXAMPLE:{SECRET}@bucket/ml-latest-small",
    ],
)
def test_an_object_store_uri_with_credentials_is_refused_when_the_config_loads(abpo, state, setting):
    rc, out, err = abpo("config", "--set", setting)
    assert rc == 2 and "rule: credentials never come from the config" in err, err
    assert SECRET not in out + err and len(err.strip().splitlines()) == 1, err


def test_an_unexpected_error_traceback_is_redacted_too(state):
    """A bug's traceback (not an expected error: Python prints it) is redacted by the `abpo` process's excepthook."""
    code = (
        "import sys; from abpo import cli; "
        "cli.expected_errors = lambda: (KeyError,); "
        "sys.argv = ['abpo', 'arms', 'status']; sys.exit(cli.main())"
    )
    env = {**os.environ, "ABPO_STATE": str(state), "ABPO_TRACKING_URI": f"postgresql://bob:{SECRET}@127.0.0.1:1/x"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" in out.stderr, out.stderr[-2000:]
    assert SECRET not in out.stdout + out.stderr and "bob:***@" in out.stderr


def test_redact_blanks_userinfo_query_secrets_and_known_values(monkeypatch):
    from abpo.redact import redact, register

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2-pw")
    text = (
        "store postgresql://u:p%40ss@db:5432/x failed; see s3://b/k?region=eu&secret_key=abc&x=1 "
        "and 'http://a:b@h' (password hunter2-pw, hunter2-pw%2F)"
    )
    out = redact(text)
    assert out == (
        "store postgresql://u:***@db:5432/x failed; see s3://b/k?region=eu&secret_key=***&x=1 "
        "and 'http://a:***@h' (password ***, ***%2F)"
    )
    assert redact(out) == out and redact("nothing secret: s3://bucket/a/b") == "nothing secret: s3://bucket/a/b"
    register("registered-secret-1")
    assert redact("it said registered-secret-1") == "it said ***"
