"""`abpo airflow install`: put the abpo_monthly DAG and the abpo UI plugin into an Airflow deployment's folders.

The two files ship with abpo (dags/ and plugins/ of the checkout, abpo/_resources/ of an installed wheel; abpo.paths
finds either); they import abpo, so the deployment's Python environment must have abpo installed too.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abpo.config import Config

DAG_FILE = "abpo_monthly.py"
PLUGIN_FILE = "abpo_plugin.py"


class InstallError(ValueError):
    """A folder given to `abpo airflow install` that cannot take the files (the message names it and the rule)."""


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "airflow",
        help="Install the abpo_monthly DAG and the abpo UI plugin into an Airflow deployment.",
        description="Airflow integration of abpo.",
    )
    asub = p.add_subparsers(dest="airflow_command", metavar="ACTION", required=True)
    i = asub.add_parser(
        "install",
        parents=[common],
        help="Copy abpo_monthly.py into --dags-folder and abpo_plugin.py into --plugins-folder.",
        description="Copy the DAG file abpo_monthly.py into the deployment's DAGs folder ([core] dags_folder) and the "
        "UI plugin abpo_plugin.py into its plugins folder ([core] plugins_folder); both folders must exist. A file "
        "already there is replaced when it differs (an upgrade) and reported. Both files import abpo: install abpo "
        "into the Python environment of the scheduler, DAG processor, API server and workers too, and set ABPO_CONFIG "
        "(preset name or YAML path) and ABPO_STATE (state directory) in their environment.",
    )
    i.add_argument(
        "--dags-folder",
        required=True,
        type=Path,
        metavar="DIR",
        help="The deployment's DAGs folder ([core] dags_folder, e.g. $AIRFLOW_HOME/dags).",
    )
    i.add_argument(
        "--plugins-folder",
        required=True,
        type=Path,
        metavar="DIR",
        help="The deployment's plugins folder ([core] plugins_folder, e.g. $AIRFLOW_HOME/plugins).",
    )
    i.set_defaults(handler=run_install)


def install(dags_folder: Path, plugins_folder: Path) -> list[tuple[Path, str]]:
    """Copy the two files; returns (destination, "installed" | "updated" | "unchanged") for each."""
    from abpo.paths import DAGS_DIR, PLUGINS_DIR

    pairs = [
        (DAGS_DIR / DAG_FILE, dags_folder, "--dags-folder"),
        (PLUGINS_DIR / PLUGIN_FILE, plugins_folder, "--plugins-folder"),
    ]
    for src, folder, flag in pairs:
        if not src.is_file():
            raise InstallError(f"{src}: abpo's own {src.name} is missing (a broken install of abpo)")
        if not folder.is_dir():
            raise InstallError(
                f"{flag} {folder}: not an existing directory (rule: give the deployment's own folder, "
                "as its airflow.cfg names it)"
            )
    done = []
    for src, folder, _ in pairs:
        dst = folder / src.name
        state = (
            "installed" if not dst.exists() else ("unchanged" if filecmp.cmp(src, dst, shallow=False) else "updated")
        )
        if state != "unchanged":
            shutil.copyfile(src, dst)
        done.append((dst, state))
    return done


def run_install(args: argparse.Namespace, cfg: Config) -> int:
    import sys

    try:
        done = install(args.dags_folder, args.plugins_folder)
    except InstallError as e:
        print(f"abpo airflow install: {e}", file=sys.stderr)
        return 2
    for dst, state in done:
        print(f"{state:9s} {dst}")
    print(
        "Airflow's processes need abpo importable and, in their environment, ABPO_CONFIG (preset or YAML) and "
        "ABPO_STATE (state directory); the DAG appears as abpo_monthly, the plugin under /abpo/."
    )
    return 0
