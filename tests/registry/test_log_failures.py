"""A model log that fails on a full disk (abpo.registry.log_pyfunc, which log_model_dir and the arms' log_model go
through) leaves no half-written artifact and no logged model behind, and says so in one line. The disk is full for
real: a 1 MB tmpfs mounted on the artifact root in a private mount namespace (ENOSPC while MLflow copies the model's
files into the artifact store), or RLIMIT_FSIZE (EFBIG while MLflow writes the model in its temporary directory,
after it created the logged model)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, resource, signal, subprocess, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from abpo import registry
from abpo.config import load_config
root, mode, limit, ckpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cfg = load_config("tiny", ["paths.root=" + root])
registry.configure(cfg)
art = cfg.paths.location("mlflow_artifacts")
with registry.start_run(cfg, "test-registry", "setup"):
    pass  # the experiment and its artifact location exist before the disk fills
if mode == "tmpfs":
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(art)], check=True)
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
out = {}
try:
    with registry.start_run(cfg, "test-registry", "full-disk"):
        registry.log_model_dir(ckpt)
except Exception as e:
    out = {"type": type(e).__name__, "message": str(e)}
out["left"] = sorted(str(p.relative_to(art)) for p in Path(art).rglob("*") if "models" in p.relative_to(art).parts[:-1])
print("RESULT " + json.dumps(out))
"""


def _checkpoint(path: Path, size: int) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"\x01" * size)
    return path


def _fill_and_log(tmp_path: Path, mode: str, limit: int, weights: int, prefix: list[str]) -> dict:
    root = tmp_path / "var"
    ckpt = _checkpoint(tmp_path / "ckpt", weights)
    out = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD, str(root), mode, str(limit), str(ckpt)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _assert_nothing_kept(tmp_path: Path, result: dict, kind: str = "ModelFilesDamaged") -> None:
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    assert result.get("type") == kind, result
    msg = result["message"]
    assert "\n" not in msg, msg
    assert msg.startswith("MLflow store sqlite:///") and "logging the model in" in msg, msg
    assert "must be writable with free space" in msg and "nothing was kept" in msg, msg
    assert result["left"] == [], result["left"]  # nothing in the store's <experiment>/models/ (no m-<id>/artifacts)
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    registry.configure(cfg)
    exp = MlflowClient().get_experiment_by_name(registry.experiment_name(cfg, "test-registry"))
    assert list(MlflowClient().search_logged_models([exp.experiment_id])) == []  # no logged model left listed


@pytest.mark.slow
def test_a_full_artifact_store_while_logging_leaves_no_partial_model(tmp_path):
    """ENOSPC in the artifact store: the 1 MB tmpfs on the artifact root fills while MLflow copies the 2 MB
    weights (and abpo's code) into the logged model's artifact folder."""
    prefix = ["unshare", "--user", "--map-root-user", "--mount"]
    if (
        shutil.which("unshare") is None
        or subprocess.run(
            [*prefix, "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("no private mount namespace here (unshare --user --mount refused): a tmpfs cannot be mounted")
    result = _fill_and_log(tmp_path, "tmpfs", 1 << 20, 2 << 20, prefix)
    assert "No space left on device" in result.get("message", ""), result
    _assert_nothing_kept(tmp_path, result, "StoreFull")  # a full disk: a refusal the DAG does not retry


@pytest.mark.slow
def test_a_file_size_limit_while_logging_leaves_no_logged_model(tmp_path):
    """EFBIG (RLIMIT_FSIZE 4 MB, weights 6 MB): MLflow has created the logged model, then fails writing the model's
    copy in its temporary directory."""
    result = _fill_and_log(tmp_path, "fsize", 4 << 20, 6 << 20, [])
    assert "File too large" in result.get("message", ""), result
    _assert_nothing_kept(tmp_path, result)
