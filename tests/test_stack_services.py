"""The stack's service scripts (docker/*.sh) run for real against a local PostgreSQL, as far as this machine allows
without a Docker engine: the same scripts the containers run, with the hosts, ports and paths that the compose file
fixes passed as the environment variables the scripts read.

* docker/postgres-init.sh creates the roles and databases from the environment (passwords with quotes), each role
  reaches its own databases only, and it refuses to run without a password.
* docker/mlflow-server.sh serves the tracking server + registry on PostgreSQL with basic auth and the allowed Host
  headers: /health open, the API 401 without or with wrong credentials, a foreign Host 403, and abpo's registry
  (register, alias, download through the proxied artifact store) round-trips through it.
* docker/airflow-init.sh (as root, as the container runs it) migrates Airflow's metadata database on PostgreSQL,
  creates the update pool, writes the simple auth manager's passwords file (mode 600) and hands the volumes to an
  AIRFLOW_UID without a passwd entry; the API server then issues a token for that password and refuses another.

Needs PostgreSQL's server binaries (initdb, pg_ctl) and, as root, a `postgres` user to run them; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest

from tests.listeners import require_loopback_only

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return next((str(v / name) for v in versions if (v / name).exists()), None)


def _pg_user() -> str | None:
    """Who runs the server: PostgreSQL refuses root, so as root the `postgres` account."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return "missing"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(**extra: str) -> dict:
    """A clean environment: no AIRFLOW_*, MLFLOW_* or ABPO_* of the test run, the venv's tools first on PATH."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR")}
    return {**keep, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", **extra}


@pytest.fixture(scope="module")
def postgres():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed")
    user = _pg_user()
    if user == "missing":
        pytest.skip("running as root without a `postgres` user to run the server")
    # its own directory under the temp root: the server's user must reach it (pytest's tmp dirs are root-only)
    root = Path(tempfile.mkdtemp(prefix="abpo-pg-"))
    as_user = ["runuser", "-u", user, "--"] if user else []
    if user:
        shutil.chown(root, user)
    port = _free_port()
    data = root / "data"
    try:
        subprocess.run(
            [*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *as_user,
                pg_ctl,
                "-D",
                str(data),
                "-w",
                "-l",
                str(root / "log"),
                "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        yield {"socket": str(root), "port": str(port)}
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "stop"], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


AIRFLOW_DB_PASSWORD = 'a\'irflow "pw" $1'  # quotes and a dollar: they reach the server as psql variables
MLFLOW_DB_PASSWORD = "ml'flow-pw"


def _psql(pg, user: str, password: str, db: str, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", pg["port"], "-U", user, "-d", db, "-tAc", sql],
        check=False,
        capture_output=True,
        text=True,
        env=_base_env(PGPASSWORD=password),
    )


@pytest.fixture(scope="module")
def initialised(postgres):
    env = _base_env(
        PGHOST=postgres["socket"],
        PGPORT=postgres["port"],
        AIRFLOW_DB_PASSWORD=AIRFLOW_DB_PASSWORD,
        MLFLOW_DB_PASSWORD=MLFLOW_DB_PASSWORD,
    )
    out = subprocess.run(
        ["bash", str(DOCKER / "postgres-init.sh")], env=env, check=False, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return postgres


def test_postgres_init_creates_each_role_with_its_own_databases(initialised):
    pg = initialised
    assert _psql(pg, "airflow", AIRFLOW_DB_PASSWORD, "airflow", "select current_user").stdout.strip() == "airflow"
    for db in ("mlflow", "mlflow_auth"):
        assert _psql(pg, "mlflow", MLFLOW_DB_PASSWORD, db, "select current_user").stdout.strip() == "mlflow"
    cross = _psql(pg, "mlflow", MLFLOW_DB_PASSWORD, "airflow", "select 1")
    assert cross.returncode != 0 and "CONNECT privilege" in cross.stderr
    wrong = _psql(pg, "airflow", "not-the-password", "airflow", "select 1")
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr


def test_postgres_init_refuses_without_a_password(postgres):
    env = _base_env(PGHOST=postgres["socket"], PGPORT=postgres["port"], MLFLOW_DB_PASSWORD="x")
    out = subprocess.run(
        ["bash", str(DOCKER / "postgres-init.sh")], env=env, check=False, capture_output=True, text=True
    )
    assert out.returncode == 1 and "AIRFLOW_DB_PASSWORD is not set" in out.stderr


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url}: no answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _status(
    url: str, *, user: str | None = None, password: str = "", host: str | None = None, data: dict | None = None
) -> tuple[int, bytes]:
    headers = {}
    if user:
        headers["Authorization"] = "Basic " + b64encode(f"{user}:{password}".encode()).decode()
    if host:
        headers["Host"] = host
    body = None
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _stop(proc: subprocess.Popen) -> None:
    """The server and the workers it forked (its own session)."""
    for sig, wait in ((15, 30), (9, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _require(*modules: str) -> None:
    from importlib.util import find_spec

    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the dev extra installs them)")


MLFLOW_ADMIN_PASSWORD = "Adm1n-password-for-the-test"

ROUND_TRIP = """
import pathlib, sys
from abpo import registry
from abpo.config import load_config
root = pathlib.Path(sys.argv[2])
cfg = load_config("tiny", [f"paths.root={root}", f"paths.mlflow_tracking_uri={sys.argv[1]}"])
registry.configure(cfg)
model = root / "model"
model.mkdir(parents=True)
(model / "config.json").write_text("{}")
(model / "weights.bin").write_bytes(bytes(range(256)) * 8)
with registry.start_run(cfg, "stack-check", "round-trip"):
    uri = registry.log_model_dir(model)
version = registry.register(uri, alias=registry.CHAMPION).version
back = registry.download_model_dir(cfg, registry.CHAMPION, root / "back")
print(version, (back / "weights.bin").read_bytes() == (model / "weights.bin").read_bytes())
"""


def test_mlflow_server_authenticates_checks_hosts_and_serves_the_registry(initialised, tmp_path):
    _require("psycopg2", "flask_wtf")
    pg = initialised
    auth_ini = tmp_path / "basic-auth.ini"  # the stack's file, with the test's database address
    auth_ini.write_text(
        (DOCKER / "mlflow-basic-auth.ini")
        .read_text()
        .replace("@postgres/mlflow_auth", f"@127.0.0.1:{pg['port']}/mlflow_auth")
    )
    port = _free_port()
    env = _base_env(
        PGPASSWORD=MLFLOW_DB_PASSWORD,
        MLFLOW_AUTH_CONFIG_PATH=str(auth_ini),
        MLFLOW_AUTH_ADMIN_USERNAME="admin",
        MLFLOW_AUTH_ADMIN_PASSWORD=MLFLOW_ADMIN_PASSWORD,
        MLFLOW_FLASK_SERVER_SECRET_KEY="test-csrf-key",
        MLFLOW_SERVER_ALLOWED_HOSTS="mlflow,mlflow:5000,localhost,localhost:*,127.0.0.1,127.0.0.1:*",
        MLFLOW_DB_HOST=f"127.0.0.1:{pg['port']}",
        MLFLOW_ARTIFACTS_DESTINATION=str(tmp_path / "artifacts"),
        MLFLOW_PORT_INTERNAL=str(port),
        MLFLOW_HOST="127.0.0.1",  # the loopback only, as every test-started service (tests/listeners.py)
        MLFLOW_WORKERS="1",
    )
    log = tmp_path / "mlflow.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            ["bash", str(DOCKER / "mlflow-server.sh")],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/health", proc, log)
        require_loopback_only([proc.pid], "docker/mlflow-server.sh")
        api = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(f"{url}/health")[0] == 200
        assert _status(api)[0] == 401
        assert _status(api, user="admin", password="wrong")[0] == 401
        assert _status(api, user="admin", password=MLFLOW_ADMIN_PASSWORD)[0] == 200
        assert _status(api, user="admin", password=MLFLOW_ADMIN_PASSWORD, host="mlflow:5000")[0] == 200
        assert _status(api, user="admin", password=MLFLOW_ADMIN_PASSWORD, host="evil.example")[0] == 403

        out = subprocess.run(
            [sys.executable, "-c", ROUND_TRIP, url, str(tmp_path / "client")],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env=_base_env(
                MLFLOW_TRACKING_USERNAME="admin",
                MLFLOW_TRACKING_PASSWORD=MLFLOW_ADMIN_PASSWORD,
                MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
            ),
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split()[-2:] == ["1", "True"], out.stdout
        # the artifacts went through the server into its destination, not to the client's disk
        assert any(p.name == "weights.bin" for p in (tmp_path / "artifacts").rglob("*"))
    finally:
        _stop(proc)


def _airflow_env(pg, root: Path, **extra: str) -> dict:
    return _base_env(
        AIRFLOW_HOME=str(root / "home"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"postgresql+psycopg2://airflow:{AIRFLOW_URL_PASSWORD}@127.0.0.1:"
        f"{pg['port']}/airflow",
        AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(root / "logs"),
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(root / "auth" / "passwords.json"),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        ABPO_STATE=str(root / "state"),
        **extra,
    )


AIRFLOW_URL_PASSWORD = "Url-safe_airflow-pw"  # .env.example: the DB passwords go into URLs, URL-safe only
AIRFLOW_ADMIN_PASSWORD = "Adm1n-airflow-pw"


def test_airflow_init_migrates_creates_the_pool_and_the_passwords_file(initialised, tmp_path):
    _require("psycopg2", "asyncpg")
    if os.geteuid() != 0:
        pytest.skip("airflow-init runs as root in the stack (it hands the volumes to AIRFLOW_UID)")
    pg = initialised
    # the role's password, URL-safe as .env.example asks (the quoted one above is for psql only); trust on the socket
    subprocess.run(
        [
            "psql",
            "-h",
            pg["socket"],
            "-p",
            pg["port"],
            "-U",
            "postgres",
            "-c",
            f"ALTER ROLE airflow PASSWORD '{AIRFLOW_URL_PASSWORD}'",
        ],
        check=True,
        capture_output=True,
    )
    uid = 54321  # no passwd entry: as with AIRFLOW_UID=$(id -u) of a host user
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    env = _airflow_env(
        pg,
        tmp_path,
        AIRFLOW_UID=str(uid),
        AIRFLOW_ADMIN_PASSWORD=AIRFLOW_ADMIN_PASSWORD,
        ABPO_UPDATE_POOL="gpu",
        ABPO_UPDATE_POOL_SLOTS="2",
    )
    out = subprocess.run(
        ["bash", str(DOCKER / "airflow-init.sh")],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "Database migration done" in out.stdout + out.stderr

    passwords = tmp_path / "auth" / "passwords.json"
    st = passwords.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, 0, 0o600)
    assert json.loads(passwords.read_text()) == {"admin": AIRFLOW_ADMIN_PASSWORD}
    for volume in ("logs", "state", "auth"):
        assert (tmp_path / volume).stat().st_uid == uid, volume
    pools = subprocess.run(
        ["airflow", "pools", "get", "gpu", "--output", "json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert json.loads(pools)[0]["slots"] in (2, "2")

    # the API server logs the admin in with that password, and nobody with another
    port = _free_port()
    log = tmp_path / "api.log"
    api_env = {**env, "AIRFLOW__API_AUTH__JWT_SECRET": "test-jwt-secret"}
    with log.open("w") as f:
        proc = subprocess.Popen(
            ["airflow", "api-server", "--host", "127.0.0.1", "--port", str(port)],
            env=api_env,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/api/v2/version", proc, log)
        require_loopback_only([proc.pid], "airflow api-server")
        code, body = _status(f"{url}/auth/token", data={"username": "admin", "password": AIRFLOW_ADMIN_PASSWORD})
        assert code in (200, 201) and json.loads(body)["access_token"], body
        assert _status(f"{url}/auth/token", data={"username": "admin", "password": "wrong"})[0] == 401
        assert json.loads(passwords.read_text()) == {"admin": AIRFLOW_ADMIN_PASSWORD}  # not regenerated
    finally:
        _stop(proc)
