"""The airflow.cfg the demo leaves behind and the one command it prints for the UI: a real Airflow reads the demo's
folders, no example DAGs and the local-only host from that file, Airflow's own settings (its generated secrets) are
kept, and the command holds everything `airflow standalone` needs (the slow test in test_abpo_monthly_e2e.py starts
it after a real demo)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from abpo.monthly.local_airflow import demo_airflow_settings, set_airflow_cfg, standalone_command

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def _get(home: Path, section: str, key: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    p = subprocess.run(
        [AIRFLOW, "config", "get-value", section, key],
        env={**env, "AIRFLOW_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=home,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_the_demo_settings_land_in_airflow_cfg_and_airflow_reads_them(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    assert _get(home, "core", "load_examples") == "True"  # Airflow writes its default airflow.cfg
    fernet = _get(home, "core", "fernet_key")
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "my dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": "/x/plugins"}
    set_airflow_cfg(home / "airflow.cfg", demo_airflow_settings(env))
    assert _get(home, "core", "dags_folder") == str(tmp_path / "my dags")
    assert _get(home, "core", "plugins_folder") == "/x/plugins"
    assert _get(home, "core", "load_examples") == "False"
    assert _get(home, "api", "host") == "127.0.0.1"
    assert _get(home, "core", "fernet_key") == fernet  # the rest of Airflow's file is kept
    text = (home / "airflow.cfg").read_text()
    assert text.count("\ndags_folder = ") == 1 and text.splitlines().count("[core]") == 1


def test_a_missing_file_or_section_is_written(tmp_path):
    cfg = tmp_path / "airflow.cfg"
    set_airflow_cfg(cfg, {("core", "load_examples"): "False", ("api", "host"): "127.0.0.1"})
    assert cfg.read_text() == "\n[core]\nload_examples = False\n\n[api]\nhost = 127.0.0.1\n"
    cfg.write_text("[core]\n# load_examples = True\nx = 1\n")
    set_airflow_cfg(cfg, {("core", "load_examples"): "False"})
    assert cfg.read_text() == "[core]\n# load_examples = True\nx = 1\nload_examples = False\n"


def test_the_printed_command_puts_airflows_bin_on_path_and_sets_the_demos_environment(tmp_path):
    env = {"AIRFLOW_HOME": str(tmp_path / "a b"), "ABPO_CONFIG": "/c/demo.yaml", "ABPO_STATE": str(tmp_path)}
    cmd = standalone_command(env)
    words = shlex.split(cmd.replace('"$PATH"', "REST"))
    assert words[0] == f"PATH={Path(AIRFLOW).parent}:REST"
    assert words[1:4] == [f"AIRFLOW_HOME={tmp_path / 'a b'}", "ABPO_CONFIG=/c/demo.yaml", f"ABPO_STATE={tmp_path}"]
    assert words[4:] == [AIRFLOW, "standalone"]
    # the shell sees it the same way: print the environment the command would give airflow
    probe = cmd.replace(f"{shlex.quote(AIRFLOW)} standalone", "env")
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30).stdout
    assert f"AIRFLOW_HOME={tmp_path / 'a b'}\n" in out
    assert f"\nPATH={Path(AIRFLOW).parent}:" in "\n" + out
