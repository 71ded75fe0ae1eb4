"""Shared fixtures (keep small): the bundled MovieLens dataset, a fresh data config, the one config helper
(``make_cfg``: the tiny preset with its state under the test's tmp_path), the one tiny-model builder
(``build_tiny_model``: a `tiny` model + tokenizer per (policy config, titles), built once per session), and the tiny
preset on a MovieLens slice for SFT."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Tests never write into the user's state directory (var/): anything that falls back to the configured
# default lands in a throw-away directory instead. Tests that need their own state pass paths.root.
os.environ["ABPO_STATE"] = tempfile.mkdtemp(prefix="abpo-test-state-")


def remove_at_exit(path: str | Path) -> None:
    """Remove a throw-away directory of this test process (its state, Airflow home, store template) when it exits."""
    import atexit
    import shutil

    atexit.register(shutil.rmtree, str(path), True)


remove_at_exit(os.environ["ABPO_STATE"])
# Under pytest-xdist (`-n 2`) each worker is its own process with its own throw-away directories: a worker inherits
# the controller's environment, where a conftest loaded for a path argument (tests/dags/conftest.py for `pytest
# tests/dags`) may already have set the throw-away AIRFLOW_HOME; the worker drops it so that its own conftest makes
# one (two workers never share one Airflow metadata DB).
if os.environ.get("PYTEST_XDIST_WORKER") and Path(os.environ.get("AIRFLOW_HOME", "")).name.startswith(
    "abpo-airflow-home-"
):
    os.environ.pop("AIRFLOW_HOME")
# Two workers on two cores: each worker, and every process it starts (the `abpo` command, Airflow's tasks), runs torch
# on one thread unless a config sets policy.num_threads. torch's default (one thread per core) puts four threads on
# two cores, where the tiny model's many small ops wait on each other (the help of policy.num_threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("ABPO_TRACKING_URI", None)
for _var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # a developer's own MLflow server is never written to
    os.environ.pop(_var, None)

REPO_ROOT = Path(__file__).resolve().parents[1]
MOVIELENS_DIR = REPO_ROOT / "data" / "ml-latest-small"


@pytest.fixture(scope="session")
def movielens():
    """The bundled MovieLens latest-small, loaded once per session (treat as read-only)."""
    from abpo.data.loaders import load_movielens

    return load_movielens(MOVIELENS_DIR)


@pytest.fixture
def make_cfg(tmp_path):
    """Factory: ``make_cfg(*overrides, preset="tiny")`` -> the preset's Config with ``paths.root`` under this test's
    tmp_path and the ``key=value`` overrides applied (what `--set` takes)."""
    from abpo.config import load_config

    def make(*overrides: str, preset: str = "tiny"):
        return load_config(preset, [f"paths.root={tmp_path}", *overrides])

    return make


@pytest.fixture(scope="session")
def build_tiny_model(tmp_path_factory):
    """Factory: ``build_tiny_model(policy_cfg, titles)`` -> the save_pretrained directory of a `tiny` model and its
    tokenizer (abpo.policy.model.build_tiny, seed 0), built once per session for each (policy config, titles)."""
    import dataclasses
    import json

    from abpo.config.paths import PathsConfig
    from abpo.policy.model import build_tiny

    built: dict[str, str] = {}

    def build(policy_cfg, titles: dict[int, str]) -> str:
        key = json.dumps([dataclasses.asdict(policy_cfg), sorted(titles.items())], default=str)
        if key not in built:
            paths = PathsConfig(root=str(tmp_path_factory.mktemp("tiny_model")))
            built[key] = build_tiny(policy_cfg, paths, titles, seed=0)
        return built[key]

    return build


@pytest.fixture
def data_cfg():
    """A fresh DataConfig with the tiny preset's values (mutable per test)."""
    from abpo.config import load_config

    return load_config("tiny").data


@pytest.fixture
def make_dataset():
    """Factory: {user_id: [item ids]} (+ n_items) -> a Dataset with items 1..n_items titled t<i>."""
    import pyarrow as pa

    from abpo.data.loaders import Dataset
    from abpo.data.schemas import CATALOG_SCHEMA, INTERACTIONS_SCHEMA

    def make(sequences: dict[int, list[int]], n_items: int = 50) -> Dataset:
        ids = list(range(1, n_items + 1))
        catalog = pa.table(
            {"item_id": ids, "title": [f"t{i}" for i in ids], "genres": [[] for _ in ids]}, schema=CATALOG_SCHEMA
        )
        rows = [(u, i, p) for u, s in sorted(sequences.items()) for p, i in enumerate(s)]
        inter = pa.table(
            {
                "user_id": [r[0] for r in rows],
                "item_id": [r[1] for r in rows],
                "event_time": [None] * len(rows),
                "rating": [None] * len(rows),
                "position": [r[2] for r in rows],
            },
            schema=INTERACTIONS_SCHEMA,
        )
        return Dataset("toy", catalog, inter, dict(sequences))

    return make


@pytest.fixture
def slice_cfg(tmp_path):
    """The tiny preset on 12 MovieLens users, a very small model, state under tmp_path."""
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    cfg.data.max_users, cfg.data.sup_examples_per_user = 12, 4
    cfg.data.train_candidates, cfg.data.eval_candidates, cfg.data.update_steps = 8, 10, 2
    p = cfg.policy
    p.tiny_hidden_size, p.tiny_layers, p.tiny_heads, p.tiny_intermediate_size, p.tiny_vocab_size = 32, 1, 2, 64, 2048
    p.max_history, p.scoring_batch_tokens = 3, 8192
    cfg.update.max_completion_length = 72  # the catalog's longest answer + EOS in a 2,048-token vocabulary: 69
    cfg.sft.use_lora = False
    s = cfg.sft
    s.max_steps, s.batch_size, s.learning_rate, s.logging_steps, s.warmup_ratio = 12, 8, 1e-2, 1, 0.0
    s.eval_generation = True
    return cfg


def write_movielens_dir(
    directory, n_items: int, n_users: int, *, ratings_per_user: int = 20, tie_share: float = 0.2, seed: int = 0
) -> Path:
    """Write a MovieLens-format directory (movies.csv + ratings.csv, LF) with ``n_items`` items (ids 1..n_items,
    distinct titles "Film <i> <word>, The (<year>)", quoted like MovieLens) and ``n_users`` users (ids 1..n_users),
    each rating min(ratings_per_user, n_items) distinct items chosen by a Zipf-like popularity (seeded), at
    increasing timestamps of which a share ``tie_share`` repeat the previous second (same-second ties).
    Returns the directory. Deterministic from ``seed``."""
    import csv

    import numpy as np

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, n_items, n_users])
    words = ["Night", "River", "Love", "War", "Star", "Ghost", "City", "Dream", "Game", "Road", "Heart", "Storm"]
    genres = ["Drama", "Comedy", "Action", "Thriller", "Romance", "Horror", "Sci-Fi", "Children"]
    with open(directory / "movies.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["movieId", "title", "genres"])
        for i in range(1, n_items + 1):
            title = f"Film {i} {words[i % len(words)]}, The ({1950 + i % 70})"
            genre = "|".join(g for j, g in enumerate(genres) if (i >> j) & 1) or "(no genres listed)"
            w.writerow([i, title, genre])
    p = 1.0 / np.arange(1, n_items + 1) ** 0.8
    p /= p.sum()
    k = min(ratings_per_user, n_items)
    with open(directory / "ratings.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["userId", "movieId", "rating", "timestamp"])
        for u in range(1, n_users + 1):
            items = rng.choice(n_items, size=k, replace=False, p=p) + 1
            steps = np.where(rng.random(k) < tie_share, 0, rng.integers(1, 100_000, size=k))
            ts = 900_000_000 + u * 1_000 + np.cumsum(steps)
            for i, t in zip(items.tolist(), ts.tolist()):
                w.writerow([u, i, float(rng.integers(1, 11)) / 2, t])
    return directory


@pytest.fixture
def movielens_dir(tmp_path):
    """Factory: movielens_dir(n_items, n_users, **kw) -> a fresh MovieLens-format directory under tmp_path
    (``write_movielens_dir``; kw: ratings_per_user, tie_share, seed)."""
    made = []

    def make(n_items: int, n_users: int, **kw) -> Path:
        made.append(None)
        return write_movielens_dir(tmp_path / f"ml-{n_items}x{n_users}-{len(made)}", n_items, n_users, **kw)

    return make


@pytest.fixture(scope="session")
def dag_module():
    """dags/abpo_monthly.py loaded as a module (its DAG function abpo_monthly, its settings ENV, the names it imports;
    what its tasks do is abpo.monthly.airflow_tasks)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("abpo_monthly_for_tests", REPO_ROOT / "dags" / "abpo_monthly.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API on 127.0.0.1 (moto in server mode, its own process, a free port), with IAM enforced: user
    ``abpo`` (allowed s3:*) and user ``nobody`` (no policy: every request is denied). Yields a namespace: endpoint,
    keys {user: (access key id, secret)}. Skipped when moto is not installed (the dev extra installs it)."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import types
    import urllib.request

    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, "moto server exited"
                time.sleep(0.1)
        from tests.listeners import require_loopback_only

        require_loopback_only([proc.pid], "the S3 server (moto)")  # issue 59 point 12
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        keys = {}
        for user, allow in (("abpo", True), ("nobody", False)):
            iam.create_user(UserName=user)
            if allow:
                iam.put_user_policy(
                    UserName=user,
                    PolicyName="s3-all",
                    PolicyDocument=json.dumps(
                        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
                    ),
                )
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
        # from here on every request is authenticated and authorised (moto's INITIAL_NO_AUTH_ACTION_COUNT = 0)
        urllib.request.urlopen(
            urllib.request.Request(
                f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
            )
        ).read()
        yield types.SimpleNamespace(endpoint=endpoint, keys=keys)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """The S3 server as user ``abpo`` through the environment only (AWS_* variables, AWS_ENDPOINT_URL), with a fresh
    bucket for this test: a namespace with endpoint, keys, bucket, client (boto3) and as_user(name) (switch the
    environment's credentials)."""
    import re
    import uuid

    import boto3

    for var in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL_S3",
        "MLFLOW_S3_ENDPOINT_URL",
        "ABPO_LANDING_MARKER",
        "ABPO_STORAGE_CONNECTION",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    def as_user(name: str) -> None:
        key, secret = s3_server.keys[name]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)

    as_user("abpo")
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:8]
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3_server.keys["abpo"][0],
        aws_secret_access_key=s3_server.keys["abpo"][1],
    )
    client.create_bucket(Bucket=bucket)
    import types

    return types.SimpleNamespace(
        endpoint=s3_server.endpoint, keys=s3_server.keys, bucket=bucket, client=client, as_user=as_user
    )


@pytest.fixture
def abpo_only_config(tmp_path):
    """The tiny preset as a deployment's config file with arms.names [abpo]: arms.names is the deployment's design,
    not a run's override (abpo.monthly.overrides), so a test of a one-arm run writes it into the file."""
    import yaml

    from abpo.paths import CONFIG_DIR

    cfg = yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text())
    cfg.setdefault("arms", {})["names"] = ["abpo"]
    path = tmp_path / "abpo-only.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A throw-away state directory for the `abpo` command ($ABPO_STATE), returned as a Path."""
    root = tmp_path / "var"
    monkeypatch.setenv("ABPO_STATE", str(root))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    return root


@pytest.fixture
def abpo(capsys):
    """Run `abpo ARGS...` in this process: (rc, stdout, stderr)."""
    from abpo.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 2
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


# --- pi_init trained once per size and session (the month tests' bootstraps) ---------------------------------------
# Every month test starts with the bootstrap step, whose largest part is pi_init's SFT (abpo.monthly.bootstrap
# .ensure_pi_init), and most of them train it at the same sizes (tests/sizes.py). ``pi_init_state(cfg)`` puts into
# cfg's empty state directory a copy of a state in which ensure_pi_init(cfg) trained and registered pi_init, made
# once per pytest session for the config's SFT settings and the code
# (``abpo.experiment.loop_fingerprints.code_digest``), shared by the pytest-xdist workers under a file lock, and
# relocated there as a copied state is (``abpo.registry.relocate_state``, what `abpo state relocate` and the loop
# experiment's replicates use). The month's bootstrap then finds pi_init registered and reuses it, as it does in a
# state where an earlier month trained it; everything else (the arms' first champions, the ranker fits, pi_init's
# gate scores) it does itself. ABPO_TEST_FRESH_PI_INIT=1 trains pi_init in every test instead.
PI_INIT_SETTINGS = ("name", "seed", "data", "policy", "sft")  # and experiment.validation_fraction, paths less root


def pi_init_key(cfg) -> str:
    """What a state's pi_init depends on: the settings ensure_pi_init reads (:data:`PI_INIT_SETTINGS`, less
    policy.num_threads: how fast, not what, and data.known_arms: the warehouse's data contract, which the SFT never
    reads; experiment.validation_fraction, its early stopping; the paths but the root: the state's layout and
    namespace) and the code that trains and registers it."""
    import dataclasses
    import hashlib
    import json

    from abpo.experiment.loop_fingerprints import code_digest

    d = dataclasses.asdict(cfg)
    settings = {k: d[k] for k in PI_INIT_SETTINGS}
    settings["policy"] = {k: v for k, v in settings["policy"].items() if k != "num_threads"}
    settings["data"] = {k: v for k, v in settings["data"].items() if k != "known_arms"}  # the warehouse's contract
    settings["validation_fraction"] = cfg.experiment.validation_fraction
    settings["paths"] = {k: v for k, v in d["paths"].items() if k != "root"}
    blob = json.dumps([settings, code_digest()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@pytest.fixture(scope="session")
def pi_init_state(tmp_path_factory):
    """Factory: ``pi_init_state(cfg)`` -> cfg's state directory (``paths.root``, which must not hold anything yet),
    now a relocated copy of a state where pi_init was trained and registered for cfg (see above). The state's store
    must be its own SQLite ``<root>/mlflow.db`` with its artifacts under the root, as `abpo state relocate` requires."""
    import dataclasses
    import shutil

    from filelock import FileLock

    from abpo import registry
    from abpo.monthly.bootstrap import ensure_pi_init

    # the session's folder both workers see (each worker's basetemp is a popen-gw<N> folder in it)
    cache = tmp_path_factory.getbasetemp()
    cache = (cache.parent if os.environ.get("PYTEST_XDIST_WORKER") else cache) / "pi-init-states"
    cache.mkdir(parents=True, exist_ok=True)

    def make(cfg) -> Path:
        root = cfg.paths.resolve("root")
        if root.exists() and any(root.iterdir()):
            raise AssertionError(f"pi_init_state: {root} is not empty; rule: a fresh state directory")
        if os.environ.get("ABPO_TEST_FRESH_PI_INIT") == "1":
            return root
        if registry.sqlite_path(cfg.paths.tracking_uri()) != root / "mlflow.db" or any(
            not str(cfg.paths.location(k)).startswith(str(root))
            for k in ("landing", "warehouse", "models", "reports", "mlflow_artifacts")
        ):
            raise AssertionError(f"pi_init_state: {cfg.paths}: rule: the state's store and paths under its root")
        made = cache / pi_init_key(cfg)
        with FileLock(str(made) + ".lock"):
            if not (made / ".ready").exists():
                shutil.rmtree(made / "state", ignore_errors=True)
                there = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, root=str(made / "state")))
                ensure_pi_init(there)
                (made / ".ready").write_text(str(made / "state"))
        shutil.copytree(made / "state", root, dirs_exist_ok=True)
        registry.relocate_state(cfg, made / "state")
        return root

    return make


# --- New SQLite MLflow stores from one template (test time) ---------------------------------------------------------
# MLflow creates a new SQLite store's schema by running its whole chain of alembic migrations: 5-15 s per store, paid
# by every test that starts a fresh state (most tests of arms, faults, monthly, registry, plugins), against 0.2 s to
# open an existing store. In this process, abpo.registry.ensure_store on a store whose file does not exist yet first
# puts in place a copy of an empty store that ensure_store itself created once this session (same MLflow, head
# revision), its Default experiment's artifact location set to what MLflow would give it here and now
# (<cwd>/mlruns/0), then runs the real ensure_store on it (its lock, its MLflow client opening the store and checking
# the schema). The store a test gets is the same as MLflow's own fresh one; nothing else changes. Subprocesses (the
# `abpo` command run as a process, Airflow tasks) create their stores as always, and the tests of store creation
# itself (STORE_CREATION_TESTS) get MLflow's own creation. ABPO_TEST_FRESH_MLFLOW_STORES=1 turns this off.
STORE_CREATION_TESTS = ("tests/dags/", "tests/test_registry.py", "tests/registry/")
_store_template: dict[str, object] = {}


def _empty_store_template(real_ensure_store) -> Path | None:
    """The session's empty SQLite store (made by the real ensure_store under a temporary directory), or None when its
    Default experiment's artifact location is not the one this copying knows how to set (then stores are created by
    MLflow as usual)."""
    if "db" not in _store_template:
        import logging
        import sqlite3

        db = Path(tempfile.mkdtemp(prefix="abpo-test-mlflow-template-")) / "mlflow.db"
        remove_at_exit(db.parent)
        quiet = logging.getLogger("mlflow.store.db.utils")  # its "Creating initial MLflow database tables" lines
        level = quiet.level  # would land in the output of whichever test first needs a store
        quiet.setLevel(logging.WARNING)
        try:
            real_ensure_store(f"sqlite:///{db}")
        finally:
            quiet.setLevel(level)
        with sqlite3.connect(db) as con:
            rows = con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        expected = os.path.join(os.path.abspath("mlruns"), "0")
        _store_template["db"] = db if db.is_file() and rows == [(0, expected)] else None
    return _store_template["db"]


@pytest.fixture(autouse=True)
def _no_tracking_uri_left_in_the_environment():
    """Before and after every test (its wider-scoped fixtures set up), the worker's environment names no MLflow
    store, as at start-up (above).
    ``mlflow.set_tracking_uri`` writes $MLFLOW_TRACKING_URI into the process's environment, and a test that calls it
    directly (to read a store) left it there for the rest of the worker's tests: a later test's ``abpo``
    subprocess then took that store as the user's ($MLFLOW_TRACKING_URI comes before paths.root) and wrote its runs
    into an earlier test's directory. tests/train/test_update_signals.py[SIGTERM] waited 300 s for a run that had
    opened in tests/train/test_distributed.py's store (fresh-clone runs of 47c85fc and bcee1f4)."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "ABPO_TRACKING_URI")
    for var in names:
        os.environ.pop(var, None)
    yield
    for var in names:
        os.environ.pop(var, None)


@pytest.fixture(autouse=True)
def _new_mlflow_stores_from_a_template(request, monkeypatch):
    if os.environ.get("ABPO_TEST_FRESH_MLFLOW_STORES") == "1" or request.node.nodeid.startswith(STORE_CREATION_TESTS):
        yield
        return
    import contextlib
    import fcntl
    import shutil
    import sqlite3
    import time

    from abpo import registry

    glob = getattr(getattr(registry, "configure", None), "__globals__", {})  # the module whose configure() calls it
    real = glob.get("ensure_store")
    if real is None or "sqlite_path" not in glob:
        yield
        return

    def ensure_store(uri: str) -> None:
        db = glob["sqlite_path"](uri)
        if db is not None and uri not in glob.get("_initialised", ()) and not os.path.lexists(db):
            template = _empty_store_template(real)
            if template is not None:
                part = db.with_name(f"{db.name}.template-{os.getpid()}")
                try:
                    # under ensure_store's own lock file: where that cannot be made (a read-only state) no store is
                    # put in place, and the real ensure_store reports it as always
                    db.parent.mkdir(parents=True, exist_ok=True)  # as ensure_store does
                    with open(f"{db}.init.lock", "a") as lock:
                        fcntl.flock(lock, fcntl.LOCK_EX)
                        shutil.copyfile(template, part)
                        now = int(time.time() * 1000)
                        with sqlite3.connect(part) as con:
                            con.execute(
                                "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                                "last_update_time = ? WHERE experiment_id = 0",
                                (os.path.join(os.path.abspath("mlruns"), "0"), now, now),
                            )
                        con.close()
                        os.link(part, db)  # only where no store exists (a store made meanwhile is kept)
                except OSError:
                    pass  # an unwritable directory, a store made meanwhile: the real ensure_store does its own
                finally:
                    with contextlib.suppress(OSError):
                        part.unlink()
        real(uri)

    monkeypatch.setitem(glob, "ensure_store", ensure_store)
    yield


# --- Order under pytest-xdist (make test: -n 2 --dist load --maxschedchunk 1) ---------------------------------------
# The longest tests first (longest-processing-time-first): with --maxschedchunk 1 each worker takes the next test from
# the front of the list whenever it holds fewer than two, so both start on long tests and the short ones fill in after;
# a long test started last would leave one worker idle at the end. (Without it, --dist load hands each worker a
# quarter of its share as one consecutive block: the slow tests at the front would all go to the first worker.)
# LONGEST is the files of make test's slowest tests (its --durations=15 list), longest first; then the other slow
# tests, then the rest, each group in collection order. A serial run keeps pytest's order.
LONGEST = (
    "tests/policy/test_pi_init_quality.py",
    "tests/dags/test_abpo_monthly_e2e.py",
    "tests/policy/test_smollm2_e2e.py",
    "tests/dags/test_approval_e2e.py",
    "tests/dags/test_fault_e2e.py",
    "tests/dags/test_celery_e2e.py",
    "tests/dags/test_beyond_demo_e2e.py",
    "tests/arms/test_namespaces.py",
    "tests/arms/test_cycle.py",
    "tests/dags/test_month_rerun_e2e.py",
    "tests/dags/test_operations_e2e.py",
)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only a pytest-xdist worker (it resets its own numprocesses option)
        return
    rank = {path: i for i, path in enumerate(LONGEST)}

    def key(item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in rank and item.get_closest_marker("slow"):
            return (0, rank[path])
        return (1 if item.get_closest_marker("slow") else 2, 0)

    items.sort(key=key)
