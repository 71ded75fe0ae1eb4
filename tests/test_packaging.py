"""abpo as a package: the wheel carries configs/, sql/, dags/, plugins/, the report templates and the bundled data
(pyproject.toml's force-include); `abpo airflow install` puts the DAG and the plugin into a deployment's folders,
where a real Airflow parses and loads them; `pip install .` (not editable) into a fresh virtual environment runs
from outside the checkout (slow); the GPU extra resolves against constraints-gpu.txt with a resolver only (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COUNTS = "month,arm,impressions,clicks,users\n" + "".join(
    f"{m},{a},1000,{c},200\n"
    for m in ("2026-01", "2026-02")
    for a, c in (("abpo", 61), ("grpo", 50), ("ml_retrain", 42), ("popularity", 33))
)


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that points Python or abpo at this checkout or its state."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("PYTHONPATH", "ABPO_STATE", "ABPO_CONFIG", "ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "VIRTUAL_ENV")
        and not k.startswith("AIRFLOW")
    }
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (whl,) = out.glob("abpo-*.whl")
    return whl


def test_the_wheel_carries_the_files_abpo_reads_at_run_time(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    res = "abpo/_resources/"
    for folder, pattern in (("configs", "*.yaml"), ("configs", "*.json"), ("sql", "*.sql")):
        for f in (REPO / folder).glob(pattern):
            assert f"{res}{folder}/{f.name}" in names, f.name
    for f in (
        "dags/abpo_monthly.py",
        "plugins/abpo_plugin.py",
        "data/ml-latest-small/ratings.csv",
        "data/ml-latest-small/movies.csv",
        "data/ml-latest-small/README.txt",
    ):
        assert res + f in names, f
    for f in (REPO / "abpo" / "abtest" / "templates").iterdir():
        assert f"abpo/abtest/templates/{f.name}" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "var/"))]
    meta = next(zipfile.ZipFile(wheel).read(n) for n in names if n.endswith(".dist-info/METADATA")).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    runtime = {re.split(r"[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requires if "extra ==" not in r}
    # test tools only in the dev extra; the CLI's help and completion at run time
    assert {"pytest", "ruff", "import-linter", "statsmodels"}.isdisjoint(runtime), runtime
    assert any(r.startswith("pytest") and "extra == 'dev'" in r for r in requires)
    assert {"rich-argparse", "argcomplete", "apache-airflow", "mlflow", "torch"} <= runtime


def test_constraints_gpu_keeps_the_cpu_pins_but_numpy():
    cpu, gpu = _pins(REPO / "constraints.txt"), _pins(REPO / "constraints-gpu.txt")
    shared = {k for k in cpu if k in gpu}
    assert {"torch", "transformers", "trl", "tokenizers", "apache-airflow", "mlflow"} <= shared
    assert {k: (cpu[k], gpu[k]) for k in shared if cpu[k] != gpu[k]} == {"numpy": (cpu["numpy"], "2.3.5")}
    assert {"vllm", "deepspeed"} <= set(gpu) and "abpo" not in gpu


AIRFLOW_PROBE = """
import json, sys
from airflow import plugins_manager
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"dags": sorted(bag.dags), "errors": [str(e) for e in bag.import_errors.values()],
                  "plugins": sorted(p.name for p in plugins), "plugin_errors": errors}))
"""


def _probe_airflow(python: str, dags: Path, plugins: Path, home: Path, env: dict[str, str], cwd: Path) -> dict:
    env = {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
    }
    out = subprocess.run(
        [python, "-c", AIRFLOW_PROBE, str(dags)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_airflow_install_puts_the_dag_and_plugin_where_airflow_loads_them(tmp_path, capsys):
    from abpo.cli import main

    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    rc = main(["airflow", "install", "--dags-folder", str(dags), "--plugins-folder", str(plugins)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--dags-folder {dags}: not an existing directory" in err, err
    dags.mkdir()
    plugins.mkdir()
    assert main(["airflow", "install", "--dags-folder", str(dags), "--plugins-folder", str(plugins)]) == 0
    assert f"installed {dags / 'abpo_monthly.py'}" in capsys.readouterr().out
    assert (dags / "abpo_monthly.py").read_bytes() == (REPO / "dags" / "abpo_monthly.py").read_bytes()
    assert (plugins / "abpo_plugin.py").read_bytes() == (REPO / "plugins" / "abpo_plugin.py").read_bytes()
    (plugins / "abpo_plugin.py").write_text("# an older version\n")
    assert main(["airflow", "install", "--dags-folder", str(dags), "--plugins-folder", str(plugins)]) == 0
    out = capsys.readouterr().out
    assert f"unchanged {dags / 'abpo_monthly.py'}" in out and f"updated   {plugins / 'abpo_plugin.py'}" in out
    seen = _probe_airflow(sys.executable, dags, plugins, tmp_path / "home", dict(os.environ), tmp_path)
    assert (
        seen["dags"] == ["abpo_monthly"]
        and not seen["errors"]
        and "abpo" in seen["plugins"]
        and not seen["plugin_errors"]
    ), seen


def _install(py: str, *args: str) -> list[str]:
    """The command that installs ``args`` into the fresh environment ``py``: the uv that scripts/setup.sh installed beside this interpreter
    (its cache already holds the pinned set: seconds instead of pip's minutes; the same wheel of the checkout, the same
    constraints), given pip's find-links as setup gives them; pip itself where there is no such uv (pip installs the
    same set: ``ABPO_INSTALLER=pip scripts/setup.sh``)."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        return [py, "-m", "pip", "install", *args]
    conf = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
    )
    links = [*os.environ.get("PIP_FIND_LINKS", "").split(), *(conf.stdout.split() if conf.returncode == 0 else [])]
    found = [x for d in links if os.path.exists(d) for x in ("--find-links", d)]
    return [str(uv), "pip", "install", "--python", py, *found, *args]


@pytest.mark.slow
def test_pip_install_dot_runs_outside_the_checkout(tmp_path):
    """A fresh virtual environment, `pip install -c constraints.txt <repo>` (a wheel, not editable; run by setup's
    uv, see _install), then the commands from a directory outside the checkout: no file of the checkout is read."""
    venv, outside = tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, abpo = str(venv / "bin" / "python"), str(venv / "bin" / "abpo")
    env = _clean_env(PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '')}")
    pip = subprocess.run(
        _install(py, "--quiet", "-c", str(REPO / "constraints.txt"), str(REPO)),
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    def run(*argv: str) -> str:
        p = subprocess.run(argv, cwd=outside, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
        return p.stdout

    where = json.loads(
        run(
            py,
            "-c",
            "import abpo, abpo.paths as p, importlib.util as u, json; print(json.dumps("
            "[abpo.__file__, str(p.RESOURCES), p.installed(), u.find_spec('pytest') is None]))",
        )
    )
    assert where[0].startswith(str(venv)) and where[1].startswith(str(venv)) and where[2] is True, where
    assert where[3] is True, "pytest is installed by `pip install .`: test tools belong in the dev extra"
    assert "airflow" in run(abpo, "--help") and "--month MONTH" in run(abpo, "arms", "month", "--help")
    explain = run(abpo, "config", "--explain")
    assert "paths.root" in explain and "update.delta" in explain
    assert "dataset_dir: data/ml-latest-small" in run(abpo, "config", "--config", "demo")
    (outside / "counts.csv").write_text(COUNTS)
    out = run(abpo, "report", "--csv", "counts.csv")
    report = outside / "var" / "reports" / "csv-counts"  # the state root is relative to the current directory
    assert f"report: {report / 'report.html'}" in out, out
    cells = json.loads((report / "report.json").read_text())["cells"]
    assert {(c["period"], c["arm"]) for c in cells} >= {("2026-01", "abpo"), ("2026-02", "popularity")}
    # the bundled dataset loads from the installed package
    counts = run(
        py,
        "-c",
        "from abpo.config import load_config; from abpo.data.loaders import load_dataset; "
        "ds = load_dataset(load_config('tiny').data); print(ds.catalog.num_rows, "
        "ds.interactions.num_rows)",
    )
    assert counts.split() == ["9742", "100836"], counts
    # the DAG and the plugin, installed from the wheel into an Airflow deployment's folders, load there
    dags, plugins = outside / "airflow" / "dags", outside / "airflow" / "plugins"
    dags.mkdir(parents=True)
    plugins.mkdir()
    run(abpo, "airflow", "install", "--dags-folder", str(dags), "--plugins-folder", str(plugins))
    seen = _probe_airflow(py, dags, plugins, outside / "airflow", env, outside)
    assert (
        seen["dags"] == ["abpo_monthly"]
        and not seen["errors"]
        and "abpo" in seen["plugins"]
        and not seen["plugin_errors"]
    ), seen


@pytest.mark.slow
def test_the_gpu_extra_resolves_against_constraints_gpu(tmp_path):
    """A resolver only (uv's `uv pip compile`, the installer scripts/setup.sh uses; ABPO_INSTALLER=pip: pip's dry
    run, the same set): vLLM within TRL's declared range, DeepSpeed, and the transformers, torch and the rest that
    abpo pins in the CPU set. A resolution satisfies vLLM's own requirements (transformers, torch) by definition."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    pins = tmp_path / "pins.txt"
    p = subprocess.run(
        ["bash", str(REPO / "scripts" / "check-gpu-constraints.sh"), str(pins)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resolver: uv pip compile" in p.stdout, p.stdout  # set-up installed uv: the fast resolver ran
    version = _pins(pins)
    trl_vllm = next(Requirement(r) for r in requires("trl") if r.startswith("vllm") and 'extra == "vllm"' in r)
    assert trl_vllm.specifier.contains(version["vllm"]), (trl_vllm, version["vllm"])
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert Requirement(next(r for r in extra if r.startswith("deepspeed"))).specifier.contains(version["deepspeed"])
    cpu = _pins(REPO / "constraints.txt")
    for name in ("torch", "transformers", "trl", "tokenizers", "peft", "accelerate", "apache-airflow", "mlflow"):
        assert version[name].split("+")[0] == cpu[name], (name, version[name], cpu[name])
    gpu = _pins(REPO / "constraints-gpu.txt")
    assert {k: v.split("+")[0] for k, v in version.items() if k in gpu} == {k: gpu[k] for k in version if k in gpu}
    assert "the gpu extra resolves: vllm " + version["vllm"] in p.stdout


def test_set_up_compiled_the_installed_packages_and_the_checkout_to_bytecode():
    """scripts/setup.sh leaves a .pyc beside every module the monthly steps import, the installed libraries' and the
    checkout's own, each valid for its source (Python ignores a .pyc whose recorded mtime or size differs): where
    PYTHONDONTWRITEBYTECODE is set no process writes one, and each compiled its imports from source again."""
    import importlib.util

    for name in (
        "transformers.modeling_utils",
        "mlflow.store.tracking.sqlalchemy_store",
        "airflow.models.dag",
        "torch.nn.modules.module",
        "great_expectations.core",
        "abpo.monthly.update",
        "abpo.registry.store",
    ):
        src = importlib.util.find_spec(name).origin
        pyc = Path(importlib.util.cache_from_source(src))
        assert pyc.is_file(), f"{pyc}: no bytecode for {name}; rule: scripts/setup.sh compiles at install"
        header = pyc.read_bytes()[:16]
        st = os.stat(src)
        flags = int.from_bytes(header[4:8], "little")
        if flags == 0:  # a timestamp-based .pyc: valid while the source's mtime and size are the recorded ones
            assert int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF, f"{pyc}: stale"
            assert int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF, f"{pyc}: stale"
