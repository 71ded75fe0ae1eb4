"""The real Airflow 3 services for end-to-end tests: `airflow db migrate` on a fresh SQLite metadata DB under a
temporary AIRFLOW_HOME, then the API server, the scheduler (LocalExecutor) and the DAG processor as separate
processes, and a small REST client with a token from the simple auth manager."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from abpo.monthly.local_airflow import TASK_PRELOAD
from tests.listeners import require_loopback_only

REPO = Path(__file__).resolve().parents[2]
# the DAG runs' sizes: tests/sizes.py (DAG_MONTH, DAG_MONTH_CLICKS)
# every service listens on the loopback only (tests/listeners.py checks it): the API server through [api] host (its
# default is 0.0.0.0), the scheduler with no log server (Airflow binds it to every interface, with no setting for the
# address; the tests read task logs from the files, never through it)
SERVICES = {
    "api-server": ["api-server"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, base: str):
        self.base = base
        self.token = ""

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    @staticmethod
    def wait(fn, what: str, timeout: float, every: float = 2.0):
        end = time.time() + timeout
        last = None
        while time.time() < end:
            try:
                out = fn()
                if out:
                    return out
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(every)
        raise TimeoutError(f"{what}: not within {timeout:.0f}s (last error: {last})")

    def task_states(self, run_id: str) -> dict[str, dict]:
        tis = self.call("GET", f"/api/v2/dags/abpo_monthly/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in tis}

    def wait_run(self, run_id: str, timeout: float) -> dict:
        def finished():
            r = self.call("GET", f"/api/v2/dags/abpo_monthly/dagRuns/{run_id}")
            return r if r["state"] in ("success", "failed") else None

        return self.wait(finished, "the DAG run", timeout, every=5)


class AirflowServices:
    """``with AirflowServices(tmp_path, extra_env) as af:`` migrates, starts the three services, waits for the API
    and the parsed DAG, unpauses abpo_monthly; ``af.kill(name)`` SIGKILLs a service with every process it started
    (its task processes included), ``af.start(name)`` starts it again."""

    def __init__(self, tmp_path: Path, extra_env: dict[str, str], home: Path | None = None):
        """``home``: an existing AIRFLOW_HOME (a demo's ``<state>/airflow``, its metadata DB and airflow.cfg) instead
        of a fresh one under ``tmp_path``."""
        self.tmp = tmp_path
        self.port = free_port()
        self.home, self.state = home or tmp_path / "airflow", tmp_path / "state"
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # the tasks start preloaded, as the demo's airflow.cfg and docker-compose.yml set it (abpo.monthly.preload)
            **{f"AIRFLOW__{s.upper()}__{k.upper()}": v for (s, k), v in TASK_PRELOAD.items()},
            "ABPO_SCHEDULE": "none",
            "ABPO_CONFIG": "demo",
            "ABPO_STATE": str(self.state),
            "ABPO_TASK_RETRIES": "0",
            **extra_env,
        }
        for leaked in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
            self.env.pop(leaked, None)
        self.airflow = str(Path(sys.executable).with_name("airflow"))
        self.procs: dict[str, tuple[subprocess.Popen, object]] = {}
        self.api = Api(f"http://127.0.0.1:{self.port}")

    def start(self, name: str, argv: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """Start service ``name``: ``airflow <SERVICES[name]>``, or ``argv`` (a whole command line) with ``env`` added
        to the services' environment."""
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - closed when the process is stopped
        proc = subprocess.Popen(
            argv or [self.airflow, *SERVICES[name]],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = (proc, log)

    def kill(self, name: str) -> list[int]:
        """SIGKILL the service and all its descendants at once (as a lost machine would); returns their pids.
        The tree is frozen first (SIGSTOP, repeated until no new descendant appears), so a process forked while the
        tree is being listed (a task starting just then) cannot escape as an orphan that keeps running."""
        import psutil

        proc, log = self.procs.pop(name)
        tree: dict[int, psutil.Process] = {}
        for _ in range(50):
            try:
                found = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                found = []
            new = [p for p in found if p.pid not in tree]
            if not new:
                break
            for p in new:
                tree[p.pid] = p
                try:
                    p.send_signal(signal.SIGSTOP)
                except psutil.NoSuchProcess:
                    pass
        for p in tree.values():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(tree.values()), timeout=30)
        log.close()
        return list(tree)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-4000:]

    def __enter__(self) -> AirflowServices:
        subprocess.run([self.airflow, "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=300)
        try:
            for name in SERVICES:
                self.start(name)
            self.api.token = self.api.wait(self.login, "API server token", 180)
            self.api.wait(lambda: self.api.call("GET", "/api/v2/dags/abpo_monthly")["dag_id"], "DAG parsed", 180)
            self.api.call("PATCH", "/api/v2/dags/abpo_monthly", {"is_paused": False})
            self.require_loopback_only("the services just started")
        except BaseException:
            self.stop_all()
            raise
        return self

    def require_loopback_only(self, when: str) -> None:
        """AssertionError naming every socket that a service, or a process it started (a task, the log server),
        listens on beyond the loopback (tests/listeners.py); and unless the API server's own socket is among those
        seen, which shows that the check looks at the right processes (it answered on its port just before)."""
        sockets = require_loopback_only([proc.pid for proc, _ in self.procs.values()], f"Airflow services ({when})")
        ports = {port for _, _, _, port in sockets}
        assert self.port in ports, f"Airflow services ({when}): the API server's port {self.port} not among {ports}"

    def login(self) -> str:
        """The REST client's token (the all-admins simple auth manager's; a test with named users overrides it)."""
        return self.api.call("GET", "/auth/token")["access_token"]

    def trigger(self, conf: dict) -> str:
        run = self.api.call("POST", "/api/v2/dags/abpo_monthly/dagRuns", {"logical_date": None, "conf": conf})
        assert run["logical_date"] is None  # a manual run without a logical date, as `airflow dags trigger` makes
        return run["dag_run_id"]

    def __exit__(self, *exc) -> None:
        try:
            if not exc or exc[0] is None:  # the test passed: so did every service's sockets, up to the end
                self.require_loopback_only("before they stop")
        finally:
            self.stop_all()

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc, log = self.procs.pop(name)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()


def dags_test_month(tmp_path: Path, config: Path, state: Path, month: str, logical_date: str) -> dict[str, str]:
    """``airflow dags test abpo_monthly <logical_date>`` with ``{"month": month, "simulate": true}`` on a fresh SQLite
    metadata DB under ``tmp_path/airflow``, the tasks reading the config file ``config`` and the state ``state``
    (what a re-triggered or cleared run does, in one process); asserts it succeeded and returns task id -> state."""
    import contextlib
    import sqlite3

    home = tmp_path / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLFLOW_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
            "ABPO_CONFIG": str(config),
            "ABPO_STATE": str(state),
            "ABPO_TASK_RETRIES": "0",
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        }
    )
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    conf = json.dumps({"month": month, "simulate": True})
    proc = subprocess.run(
        [airflow, "dags", "test", "abpo_monthly", logical_date, "-c", conf],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        return dict(db.execute("SELECT task_id, state FROM task_instance").fetchall())


# A .pth line (run at start-up: lines starting with "import" are executed) that makes `import airflow` fail as in an
# environment without Airflow installed.
NO_AIRFLOW = (
    'import sys; exec("class _NoAirflow:\\n    def find_spec(self, name, path=None, target=None):\\n'
    "        if name == 'airflow' or name.startswith('airflow.'):\\n"
    "            raise ModuleNotFoundError(f'No module named {name!r} (no Airflow in this environment)', "
    'name=name)\\nsys.meta_path.insert(0, _NoAirflow())")'
)


def separate_python(env_dir: Path) -> Path:
    """A Python environment of its own at ``env_dir`` (``python -m venv``: its own interpreter path and sys.prefix)
    that sees the project's packages (the checkout, then the running environment's site-packages, their .pth files
    included) but not Airflow (``import airflow`` fails there, as where it is not installed): the training
    environment of $ABPO_TASK_PYTHON, built in a second instead of installing torch a second time. Returns its
    python."""
    import site

    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True, capture_output=True, timeout=120)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines = [str(REPO), *(f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()), NO_AIRFLOW]
    Path(purelib, "abpo-project.pth").write_text("\n".join(lines) + "\n")
    return python


def assert_month_tasks(states: dict[str, str], config: str | Path = "demo", approvals: bool = False) -> None:
    """A month run of abpo_monthly under ``config`` (a preset or YAML path) ended with every task of a served arm
    (``arms.names``) and the month's own tasks a success, and every task of an arm abpo.arms.names knows but the config
    does not serve skipped (abpo.monthly.airflow_tasks.skip_unless_configured); ``states``: task id -> state of the
    run, every task of the DAG (one approval task per LLM arm with ``approvals``)."""
    from abpo.arms.names import ARMS, HOLDBACK_ARMS, LLM_ARMS, RANKER_ARMS
    from abpo.config import load_config

    served = set(load_config(config).arms.names)
    tasks = 5 + (5 if approvals else 4) * len(LLM_ARMS) + len(RANKER_ARMS) + len(HOLDBACK_ARMS)
    want = {k: "skipped" if k.split(".")[0] in ARMS and k.split(".")[0] not in served else "success" for k in states}
    assert len(states) == tasks and states == want, sorted(states.items())
