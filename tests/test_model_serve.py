"""A registered arm model serves on its own with MLflow's own server: `mlflow models serve -m
models:/abpo-arm-abpo@champion --env-manager local` on 127.0.0.1 answers /invocations with the ranked ids and the
propensities the policy code computes, and the request's `tau` param reaches the model (a second request with another
tau changes the propensities). The logged model carries what it needs without this checkout: abpo's code, pinned
requirements (no bare `abpo`), a signature with the tau param; loaded from a directory outside the checkout with no
PYTHONPATH, it imports abpo from its own code/."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.listeners import require_loopback_only
from tests.sizes import ADOPTED_MONTH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ABPO_TRACKING_URI")}
    # the virtualenv's bin on PATH, as in an activated one: MLflow's server runs `uvicorn` by name
    env.update(
        {
            "MLFLOW_TRACKING_URI": uri,
            "MLFLOW_REGISTRY_URI": uri,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        }
    )
    return env


@pytest.mark.slow
def test_mlflow_models_serve_ranks_and_takes_tau(make_cfg, build_tiny_model, tmp_path):
    import mlflow
    import torch

    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.serving import RecommenderModel

    cfg = make_cfg(*ADOPTED_MONTH)
    ds, _ = dataset_and_splits(cfg)
    titles = ds.titles()
    model_dir = build_tiny_model(cfg.policy, titles)
    assert adopt_model(cfg, "abpo", str(model_dir)).version == "1"
    uri = cfg.paths.tracking_uri()

    # what the logged model carries
    local = Path(mlflow.artifacts.download_artifacts("models:/abpo-arm-abpo@champion", dst_path=str(tmp_path / "dl")))
    reqs = (local / "requirements.txt").read_text().split()
    assert "abpo" not in {r.split("==")[0] for r in reqs} and all("==" in r for r in reqs), reqs
    assert {"torch", "transformers", "tokenizers", "mlflow"} <= {r.split("==")[0] for r in reqs}
    assert (local / "code" / "abpo" / "serving.py").exists()
    meta = mlflow.models.get_model_info("models:/abpo-arm-abpo@champion")
    assert [(p.name, p.default) for p in meta.signature.params] == [("tau", cfg.policy.tau)]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = "import sys, mlflow; mlflow.pyfunc.load_model(sys.argv[1]); import abpo; print(abpo.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe, str(local)],
        cwd=outside,
        env=_env(uri),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip().splitlines()[-1]).is_relative_to(local / "code"), where.stdout

    # one request, scored here with the same checkpoint
    cand = sorted(titles)[:8]
    hist = sorted(titles)[200:212]
    record = {
        "history_titles": [titles[i] for i in hist],
        "candidate_ids": cand,
        "candidate_titles": [titles[i] for i in cand],
        "history_item_ids": hist,
    }
    import pandas as pd

    here = RecommenderModel(model_dir, cfg.policy)
    expect = {tau: here.predict(pd.DataFrame([record]), params={"tau": tau}).iloc[0] for tau in (1.0, 0.25)}

    port = _free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "models",
            "serve",
            "-m",
            "models:/abpo-arm-abpo@champion",
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=outside,
        env=_env(uri),
        stdout=(tmp_path / "serve.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-4000:]
            time.sleep(2)
        require_loopback_only([server.pid], "mlflow models serve")  # issue 59 point 12
        got = {
            tau: _post(f"http://127.0.0.1:{port}/invocations", {"dataframe_records": [record], "params": {"tau": tau}})[
                "predictions"
            ][0]
            for tau in (1.0, 0.25)
        }
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    for tau in (1.0, 0.25):
        assert got[tau]["ranked_item_ids"] == [int(i) for i in expect[tau]["ranked_item_ids"]]
        assert sorted(got[tau]["ranked_item_ids"]) == sorted(cand)
        assert torch.allclose(
            torch.tensor(got[tau]["propensities"]), torch.tensor(list(expect[tau]["propensities"])), atol=1e-5
        )
        assert abs(sum(got[tau]["propensities"]) - 1) < 1e-5
    assert max(got[0.25]["propensities"]) > max(got[1.0]["propensities"]) + 1e-3  # the tau param reached the model
