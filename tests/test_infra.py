"""infra/: launcher configs valid for Ray, KubeRay manifests complete, versions pinned alike."""

from __future__ import annotations

import re

import pytest
import yaml

from .conftest import REPO

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


def test_mlflow_deployment_has_a_database_and_an_artifact_store():
    docs = list(yaml.safe_load_all((INFRA / "mlflow" / "mlflow.yaml").read_text()))
    server = next(d for d in docs if d["kind"] == "Deployment")
    args = " ".join(server["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--backend-store-uri postgresql://" in args and "--artifacts-destination" in args
    assert any(d["kind"] == "StatefulSet" and d["metadata"]["name"] == "postgres" for d in docs)


def test_image_pins_the_same_versions_as_pyproject():
    dockerfile = (INFRA / "docker" / "Dockerfile").read_text()
    for package, version in pins().items():
        assert re.search(rf'"{package}(\[[^\]]*\])?=={re.escape(version)}"', dockerfile), (
            f"{package}=={version} not pinned"
        )
