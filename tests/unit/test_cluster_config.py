"""ray_cluster.yaml: valid for Ray's own launcher schema (offline), GPU worker types, token auth, private dashboard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "ray_cluster.yaml"


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


def test_head_is_cpu_only_and_takes_no_work(prepared: dict[str, Any]) -> None:
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert head["resources"] == {"CPU": 0}
    assert any("--num-cpus=0" in command for command in prepared["head_start_ray_commands"])


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
