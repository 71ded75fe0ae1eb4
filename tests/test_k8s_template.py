"""docker/k8s/update-pod-template.yaml, the pod template of the KubernetesPodOperator variant (docs/deployment-celery.md):
not run here (no cluster), but it parses, asks for one NVIDIA GPU, runs the isolated steps' module command in the
container KubernetesPodOperator uses (base), and mounts the shared state where ABPO_STATE points."""

from pathlib import Path

import yaml

from abpo.monthly import isolated

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_pod_template_runs_the_isolated_steps_command():
    pod = yaml.safe_load((REPO / "docker" / "k8s" / "update-pod-template.yaml").read_text())
    assert pod["kind"] == "Pod" and pod["spec"]["restartPolicy"] == "Never"
    (base,) = pod["spec"]["containers"]
    assert base["name"] == "base"
    assert base["command"] == ["python", "-m", isolated.__name__]
    assert base["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in base["env"]}
    mounts = {m["mountPath"]: m["name"] for m in base["volumeMounts"]}
    assert mounts[env["ABPO_STATE"]] == "abpo-state"
    assert {v["name"] for v in pod["spec"]["volumes"]} >= set(mounts.values())
    # the doc's operator example uses the module's exit codes and the template by this path
    doc = (REPO / "docs" / "deployment-celery.md").read_text()
    assert "docker/k8s/update-pod-template.yaml" in doc and f"skip_on_exit_code={isolated.EXIT_SKIPPED}" in doc
