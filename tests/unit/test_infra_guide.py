"""infra/README.md walks both cluster paths step by step, and every command in the guides works as written:
`ray job submit` with token auth, Services that exist, files that exist, placeholders its `sed` lines replace."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "infra" / "README.md"
DOCUMENTED = [ROOT / "README.md", GUIDE, ROOT / "ray_cluster.yaml", ROOT / "pipelines" / "sweep.py",
              *sorted((ROOT / "pipelines" / "configs").rglob("*.yaml")), *sorted((ROOT / "infra").rglob("*.yaml"))]


def blocks(text: str) -> list[str]:
    """Fenced shell blocks, continuation lines joined; a file without fences (YAML, Python) is one block."""
    found = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S) or [text]
    return [re.sub(r"\\\n\s*(#\s*)?", " ", block) for block in found]


@pytest.mark.parametrize("path", DOCUMENTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_ray_job_submit_sends_the_token(path: Path) -> None:
    """Any local Ray run leaves a token in ~/.ray/auth_token; a client without RAY_AUTH_MODE=token gets 401."""
    for block in blocks(path.read_text()):
        exported = False
        for line in block.splitlines():
            exported |= bool(re.search(r"export RAY_AUTH_MODE=token\b", line))
            if re.search(r"ray job submit (--address|--working-dir)", line):
                assert exported or re.search(r"RAY_AUTH_MODE=token \S*ray job submit", line), line


def test_port_forwards_name_services_that_exist() -> None:
    defined = {doc["metadata"]["name"] for path in (ROOT / "infra").rglob("*.yaml")
               for doc in [yaml.safe_load(path.read_text())] if doc.get("kind") == "Service"}
    named = set()
    for path in DOCUMENTED:
        named |= set(re.findall(r"kubectl port-forward svc/((?:\$\([^)]*\)|\S)+)", path.read_text()))
    assert named, "the guides show how to reach the dashboard"
    for service in named:  # KubeRay names the head Service <RayCluster name>-head-svc
        assert service.endswith("-head-svc") or service in defined, f"svc/{service} is defined nowhere"


def _steps(section: str) -> list[str]:
    return re.split(r"\n(?=\d+\. \*\*)", section)[1:]


@pytest.mark.parametrize("path_title", ["## Path 1: AWS VMs with `ray up`", "## Path 2: Kubernetes with KubeRay"])
def test_the_guide_walks_each_path_and_says_what_each_step_proves(path_title: str) -> None:
    text = GUIDE.read_text()
    section = text.split(path_title, 1)[1].split("\n## ", 1)[0]
    steps = _steps(section)
    assert len(steps) >= 5
    for step in steps:
        if "```bash" in step:
            assert "Proves:" in step.split("```")[-1], step.splitlines()[0]


def test_the_guide_creates_everything_the_cluster_files_assume() -> None:
    text = GUIDE.read_text()
    for command in ("aws ecr create-repository --repository-name capt", "aws iam create-instance-profile",
                    "aws efs create-file-system", "aws efs create-mount-target", "ray get-auth-token --generate",
                    "ray up ray_cluster.yaml", "ray down ray_cluster.yaml",
                    "kubectl apply -f infra/kuberay/rayjob.yaml",
                    'create_user("capt"', "KubeRay 1.5.1 or newer"):
        assert command in text, command
    for mentioned in set(re.findall(r"\binfra/[\w/.-]+\.(?:yaml|sh)\b", text)):
        assert (ROOT / mentioned).is_file(), mentioned


def test_every_sed_of_the_guide_replaces_a_placeholder_that_is_there() -> None:
    seds = [line.strip() for block in blocks(GUIDE.read_text()) for line in block.splitlines()
            if line.strip().startswith("sed -i")]
    assert len(seds) >= 4
    for line in seds:
        words = shlex.split(line.replace("$", ""))
        script, files = words[2], words[3:]
        for expression in script.split(";"):
            placeholder = expression.strip().split("/")[1]
            for name in files:
                assert placeholder in (ROOT / name).read_text(), f"{line}: {placeholder} is not in {name}"
