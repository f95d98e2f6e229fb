"""ray_cluster.yaml: valid for Ray's own launcher schema (offline), GPU worker types, token auth, private dashboard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.sweeps.resources import (
    TRIAL_CPU,
    TRIAL_DRIVER_RESOURCE,
    driver_resources,
    runs_in_trial_process,
    trial_demand,
    worker_bundle,
)

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "ray_cluster.yaml"
PAPER = CLUSTER_YAML.parent / "pipelines" / "configs" / "paper"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.fixture(scope="module")
def prepared(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as `ray up` sees it after Ray fills in its defaults, validated against Ray's schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))
    validate_config(config)
    return config


def test_validates_with_rays_launcher_schema(prepared: dict[str, Any]) -> None:
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_head_is_cpu_only_and_hosts_only_trial_drivers(prepared: dict[str, Any]) -> None:
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert head["resources"]["CPU"] == 0 and set(head["resources"]) == {"CPU", TRIAL_DRIVER_RESOURCE}
    assert any("--num-cpus=0" in command for command in prepared["head_start_ray_commands"])
    assert driver_resources(head["resources"]) == {TRIAL_DRIVER_RESOURCE: 1.0}


@pytest.mark.parametrize("config", sorted(PAPER.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_paper_trial_fits_on_one_gpu_node_with_its_driver_on_the_head(prepared: dict[str, Any], config: Path) -> None:
    """A driver asking CPU would land on a GPU worker (the head has none) and push the trial's own worker to a
    second node; on the head's resource the whole worker group fits on one node of some worker type."""
    from pipelines.sweeps.config import load_sweep_config

    resources = load_sweep_config(config, ["data_source=generated", "models=[tiny-t5]"]).resources
    nodes = dict(prepared["available_node_types"])
    head = nodes.pop(prepared["head_node_type"])
    demand = trial_demand(resources, driver_resources(head["resources"]))
    on_workers = {name: amount for name, amount in demand.items() if name != TRIAL_DRIVER_RESOURCE}
    assert any(all(node["resources"].get(k, 0) >= v for k, v in on_workers.items()) for node in nodes.values())
    if runs_in_trial_process(resources):  # the trial process is its one worker: no driver anywhere
        assert demand == trial_demand(resources, {"CPU": TRIAL_CPU}) == worker_bundle(resources)
        return
    with_cpu_driver = trial_demand(resources, {"CPU": TRIAL_CPU})
    assert not all(nodes["gpu_1x"]["resources"].get(k, 0) >= v for k, v in with_cpu_driver.items())


def test_every_node_pulls_with_its_own_instance_profile(raw: dict[str, Any]) -> None:
    profiles = {name: node["node_config"]["IamInstanceProfile"]["Name"]
                for name, node in raw["available_node_types"].items()}
    head = profiles.pop(raw["head_node_type"])
    assert head == "capt-ray-head" and set(profiles.values()) == {"capt-ray-worker"}
    guide = (CLUSTER_YAML.parent / "infra" / "README.md").read_text()
    for name in ("capt-ray-head", "capt-ray-worker", "AmazonEC2ContainerRegistryReadOnly", "iam:PassRole"):
        assert name in guide, f"infra/README.md must say how to create {name}"
    assert any("aws ecr get-login-password" in c for c in raw["initialization_commands"])


def test_shared_storage_is_mounted_on_every_node_and_used_by_the_paper_sweeps(raw: dict[str, Any]) -> None:
    init = " ".join(raw["initialization_commands"])
    assert re.search(r"mount -t nfs4 .*fs-\w+\.efs\.[\w-]+\.amazonaws\.com:/ /mnt/shared", init)
    assert "chown 1000:1000 /mnt/shared/capt" in init, "the image's user (uid 1000) must be able to write"
    assert "--volume /mnt/shared:/mnt/shared" in raw["docker"]["run_options"]
    assert any("/mnt/shared/capt" in c and "writable" in c for c in raw["setup_commands"])
    for config in sorted(PAPER.glob("*.yaml")):
        assert yaml.safe_load(config.read_text())["storage_path"].startswith("/mnt/shared/capt/"), config.name


def test_gpu_worker_types_and_bounds(prepared: dict[str, Any]) -> None:
    workers = {
        name: node
        for name, node in prepared["available_node_types"].items()
        if name != prepared["head_node_type"]
    }
    gpus = sorted(node["resources"].get("GPU", 0) for node in workers.values())
    assert gpus == [1, 8]
    instances = {node["node_config"]["InstanceType"] for node in workers.values()}
    assert {"g5.xlarge", "p4d.24xlarge"} <= instances
    for node in workers.values():
        assert 0 <= node["min_workers"] <= node["max_workers"] <= prepared["max_workers"]
    assert sum(node["max_workers"] for node in workers.values()) >= prepared["max_workers"]


def test_runs_in_the_project_image(raw: dict[str, Any]) -> None:
    docker = raw["docker"]
    assert docker["image"].rsplit("/", 1)[-1].startswith("capt:") and docker["container_name"]
    assert "infra/docker/Dockerfile" in CLUSTER_YAML.read_text()


@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_token_auth_and_mlflow_env_on_every_node(raw: dict[str, Any], key: str) -> None:
    start = [command for command in raw[key] if "ray start" in command]
    assert start and all("RAY_AUTH_MODE=token" in command for command in start)
    assert all("MLFLOW_TRACKING_URI" in command for command in start)


def test_dashboard_is_bound_to_loopback_only(raw: dict[str, Any]) -> None:
    commands = " ".join(raw["head_start_ray_commands"] + raw["worker_start_ray_commands"])
    assert re.search(r"--dashboard-host[ =]127\.0\.0\.1\b", commands)
    assert "0.0.0.0" not in yaml.safe_dump(raw)


def test_token_and_mlflow_settings_are_mounted_not_committed(raw: dict[str, Any]) -> None:
    mounts = raw["file_mounts"]
    assert "~/.ray/auth_token" in mounts
    assert any(local.startswith(".capt/") for local in mounts.values())
    assert ".capt/" in (CLUSTER_YAML.parent / ".gitignore").read_text().split()


def test_header_documents_the_commands() -> None:
    header = CLUSTER_YAML.read_text().split("\ncluster_name:")[0]
    for command in ("ray up", "ray attach", "ray dashboard", "ray job submit", "ray down", "8265"):
        assert command in header
