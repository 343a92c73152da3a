"""infra/: launcher configs valid for Ray, KubeRay manifests complete, versions pinned alike."""

from __future__ import annotations

import re

import pytest
import yaml

from .helpers import REPO

INFRA = REPO / "infra"


def pins() -> dict[str, str]:
    """The runtime pins of pyproject.toml: {"ray": "2.60.0", ...}."""
    import tomllib

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\[=]", d)[0]: d.split("==")[1] for d in dependencies}


@pytest.mark.parametrize("name", ["aws-gpu.yaml", "onprem-gpu.yaml"])
def test_cluster_launcher_configs_validate_against_rays_schema(name):
    import json
    from pathlib import Path

    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((INFRA / "cluster-launcher" / name).read_text())
    jsonschema.validate(config, schema)  # raises on a schema violation
    assert config["cluster_name"] and config["head_start_ray_commands"]


def kuberay_docs():
    for path in sorted((INFRA / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            yield path.name, doc


def test_kuberay_manifests_carry_required_fields():
    kinds = {}
    for name, doc in kuberay_docs():
        kinds[doc["kind"]] = doc
        assert doc["apiVersion"] and doc["metadata"]["name"], name
    cluster = kinds["RayCluster"]["spec"]
    job_cluster = kinds["RayJob"]["spec"]["rayClusterSpec"]
    assert kinds["RayJob"]["spec"]["entrypoint"].startswith("rayparallel train ")
    for spec in (cluster, job_cluster):
        assert spec["rayVersion"] == pins()["ray"]
        assert spec["headGroupSpec"]["template"]["spec"]["containers"]
        group = spec["workerGroupSpecs"][0]
        assert group["groupName"] and "rayStartParams" in group
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert any(e["name"] == "MLFLOW_TRACKING_URI" for e in container["env"])
        assert any(v["mountPath"] == "/mnt/shared" for v in container["volumeMounts"])
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]


def mlflow_docs() -> dict:
    docs = list(yaml.safe_load_all((INFRA / "mlflow" / "mlflow.yaml").read_text()))
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def from_secret(env: list, name: str) -> bool:
    """The variable is set from a Secret, never written into the manifest."""
    entry = next((e for e in env if e["name"] == name), None)
    return entry is not None and "value" not in entry and "secretKeyRef" in entry["valueFrom"]


def test_mlflow_deployment_has_a_database_and_an_artifact_store():
    docs = mlflow_docs()
    container = docs["Deployment", "mlflow"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://") and env["MLFLOW_ARTIFACTS_DESTINATION"]
    assert ("StatefulSet", "postgres") in docs


def test_mlflow_is_served_with_authentication_from_a_built_image_reachable_only_from_ray():
    docs = mlflow_docs()
    pod = docs["Deployment", "mlflow"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--app-name basic-auth" in " ".join(container["args"])
    for step in pod["containers"] + pod.get("initContainers", []):  # nothing installed at start
        assert "pip" not in " ".join(step.get("command", []) + step.get("args", []))
        assert step["image"].startswith("ghcr.io/your-org/rayparallel-mlflow:")
    for name in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "POSTGRES_PASSWORD"):
        assert from_secret(container["env"], name), name
    ini = docs["ConfigMap", "mlflow-auth-config"]["data"]["basic_auth.ini"]
    assert "admin_password" not in ini and "authenticate_request_basic_auth" in ini
    ingress = docs["NetworkPolicy", "mlflow-from-ray-only"]["spec"]
    assert ingress["podSelector"]["matchLabels"] == {"app": "mlflow"} and ingress["policyTypes"] == ["Ingress"]
    assert ingress["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
    dockerfile = (INFRA / "mlflow" / "Dockerfile").read_text()
    assert f'"mlflow[auth]=={pins()["mlflow"]}"' in dockerfile and "psycopg2-binary==" in dockerfile


def test_ray_pods_take_mlflow_credentials_from_a_secret():
    containers = []
    for _, doc in kuberay_docs():
        if doc["kind"] in ("RayCluster", "RayJob"):
            spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
            groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
            containers += [c for g in groups for c in g["template"]["spec"]["containers"]]
        if doc["kind"] == "RayJob":  # a job's runtime_env is readable by anyone who can list jobs
            assert "PASSWORD" not in doc["spec"]["runtimeEnvYAML"]
    assert len(containers) == 4
    for container in containers:
        assert from_secret(container["env"], "MLFLOW_TRACKING_USERNAME")
        assert from_secret(container["env"], "MLFLOW_TRACKING_PASSWORD")


def test_image_pins_the_same_versions_as_pyproject():
    dockerfile = (INFRA / "docker" / "Dockerfile").read_text()
    for package, version in pins().items():
        assert re.search(rf'"{package}(\[[^\]]*\])?=={re.escape(version)}"', dockerfile), (
            f"{package}=={version} not pinned"
        )
