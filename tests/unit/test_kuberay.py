"""infra/kuberay: the RayJob validates against KubeRay's own RayJob CRD (v1.7.0, ../shared/schemas) with no key
that Kubernetes would silently prune; the head hosts the trial drivers, GPU workers start from zero, and every
Ray pod mounts the same ReadWriteMany claim at the sweeps' storage path."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from pipelines.sweeps.resources import TRIAL_DRIVER_RESOURCE, driver_resources

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "infra" / "kuberay"
# The workspace's shared/schemas beside the clone (as CI lays it out); CAPT_SCHEMAS_DIR names another folder.
SCHEMAS = Path(os.environ.get("CAPT_SCHEMAS_DIR", ROOT.parent / "shared" / "schemas"))
CRD = SCHEMAS / "kuberay-v1.7.0-ray.io_rayjobs.yaml"
ROOT_KEYS_KUBERNETES_KEEPS = {"apiVersion", "kind", "metadata"}  # ObjectMeta is never pruned


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    if not CRD.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{CRD} not found: CI must validate the RayJob against KubeRay's CRD")
        pytest.skip(f"{CRD} not found (the workspace's shared/schemas; CAPT_SCHEMAS_DIR names another folder)")
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 5x faster
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def rayjob() -> dict[str, Any]:
    return yaml.safe_load((KUBERAY / "rayjob.yaml").read_text())


def pruned_keys(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every key of `value` that Kubernetes would drop: not in the schema's `properties`, where the schema keeps
    no unknown fields (`x-kubernetes-preserve-unknown-fields`) and has no `additionalProperties`."""
    if isinstance(value, list):
        items = schema.get("items", {})
        return [key for i, item in enumerate(value) for key in pruned_keys(item, items, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    properties, extra = schema.get("properties", {}), schema.get("additionalProperties")
    for key, inner in value.items():
        where = f"{path}.{key}" if path else key
        if path == "" and key in ROOT_KEYS_KUBERNETES_KEEPS:
            continue
        if key in properties:
            found += pruned_keys(inner, properties[key], where)
        elif isinstance(extra, dict):
            found += pruned_keys(inner, extra, where)
        elif not extra:
            found.append(where)
    return found


def check(manifest: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Problems a `kubectl apply` would meet: schema errors (rejected) and pruned keys (silently dropped)."""
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    return errors + [f"{key}: not in the RayJob schema, Kubernetes would drop it" for key in
                     pruned_keys(manifest, schema)]


def test_the_rayjob_validates_against_kuberays_crd_and_loses_no_key(rayjob, schema) -> None:
    assert check(rayjob, schema) == []


def test_a_misspelt_or_unknown_key_is_reported(rayjob, schema) -> None:
    bad = copy.deepcopy(rayjob)
    bad["spec"]["ttlSecondsAfterFinish"] = 300
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["probes"] = {}
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplica"] = 8
    problems = check(bad, schema)
    assert sorted(problems) == sorted([
        "spec.ttlSecondsAfterFinish: not in the RayJob schema, Kubernetes would drop it",
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].probes: not in the RayJob schema, "
        "Kubernetes would drop it",
        "spec.rayClusterSpec.workerGroupSpecs[0].maxReplica: not in the RayJob schema, Kubernetes would drop it",
    ])
    bad["spec"]["backoffLimit"] = "zero"
    assert any(p.startswith("spec.backoffLimit: 'zero' is not of type 'integer'") for p in check(bad, schema))


def test_the_head_hosts_the_trial_drivers_and_gpu_workers_start_from_zero(rayjob) -> None:
    cluster = rayjob["spec"]["rayClusterSpec"]
    params = cluster["headGroupSpec"]["rayStartParams"]
    assert params["num-cpus"] == "0"
    declared = json.loads(json.loads(params["resources"]))  # KubeRay passes the value to `ray start` verbatim
    assert driver_resources({"CPU": 0.0, **declared}) == {TRIAL_DRIVER_RESOURCE: 1.0}
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] == 0 and group["replicas"] == 0, group["groupName"]
    assert cluster["enableInTreeAutoscaling"] is True


def test_every_ray_pod_mounts_the_shared_claim_at_the_sweeps_storage_path(rayjob) -> None:
    cluster = rayjob["spec"]["rayClusterSpec"]
    claim = yaml.safe_load((KUBERAY / "shared-pvc.yaml").read_text())
    storage_class = yaml.safe_load((KUBERAY / "efs-storageclass.yaml").read_text())
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    assert storage_class["parameters"]["uid"] == "1000", "the image's user must own the files"
    for pod in [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in pod["spec"]["containers"] for m in c.get("volumeMounts", [])}
        assert volumes[mounts["/mnt/shared"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    paper = yaml.safe_load((ROOT / rayjob["spec"]["entrypoint"].split("--config ")[1]).read_text())
    assert paper["storage_path"].startswith("/mnt/shared/")


def test_the_guides_say_what_the_ttl_does(rayjob) -> None:
    minutes = rayjob["spec"]["ttlSecondsAfterFinished"] // 60
    words = {1: "one", 5: "five", 10: "ten"}.get(minutes, str(minutes))
    for guide in (ROOT / "infra" / "README.md", KUBERAY / "rayjob.yaml"):
        text = guide.read_text()
        wrapped = re.sub(r"\s*\n#?\s*", " ", text)  # sentences wrap over lines (and comment lines)
        assert re.search(rf"\b{words} minutes? after the job ends", wrapped), guide.name
        assert "deletes the cluster afterwards" not in text and "when the job ends" not in text
