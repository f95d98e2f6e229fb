"""The device check (#34, item 5) as a user runs it: `bash benchmarks/device_check.sh --cpu-smoke` runs the
step-cost table, packing and a 4-trial sweep at tiny shapes on the CPU, here on the session's Ray head and MLflow
server; GPU mode on a machine without a GPU is refused in one line.

The serving part is left out here (37 s of this test's 78 on a quiet 2-CPU machine): it ran for real on an H200
(benchmarks/results/device_check, checked by tests/unit/test_device_results.py), and the code it runs,
`benchmarks.serving.run`, is run end to end by tests/unit/test_benchmark_serving.py's quick mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks/device_check.sh"
PARTS = ("device_step_cost", "device_packing", "device_sweep")
"""The parts this test runs (all but `device_serving`: see above)."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    return {**env, "PYTHON": sys.executable, **extra}


def _part(out: Path, name: str) -> dict:
    data = json.loads((out / f"{name}.json").read_text())
    assert data["error"] is None and data["skipped"] is None, f"{name}: {data['error'] or data['skipped']}"
    assert data["tables"] and all(table["rows"] for table in data["tables"]), f"{name}: a table without rows"
    return data


def test_gpu_mode_without_a_gpu_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(["bash", SCRIPT, "--out", str(tmp_path / "out")], cwd=ROOT, env=_env(CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    command, error = proc.stderr.strip().splitlines()
    assert command.startswith("+ ") and "benchmarks.device_check" in command
    assert error.startswith("error: GPU mode needs a CUDA GPU") and "--cpu-smoke" in error
    assert not (tmp_path / "out").exists()


def test_cpu_smoke_runs_its_parts_and_fails_none(ray_head, mlflow_server, tmp_path):
    out = tmp_path / "out"
    command = ["bash", SCRIPT, "--cpu-smoke", "--out", str(out), "--only", *PARTS, "--ray-address", ray_head.address,
               "--tracking-uri", mlflow_server.uri]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=_env(**ray_head.client_env()), capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - start
    print(f"device_check --cpu-smoke: {wall:.1f} s wall; {proc.stdout.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.startswith("+ ") and "failed: none" in proc.stdout
    steps = _part(out, "device_step_cost")
    assert [t["title"].split(" ")[0] for t in steps["tables"]] == ["t5-base", "llama-3.2-1b", "qwen2.5-1.5b"]
    assert all("bfloat16 on cpu" in t["title"] and {"floor", "capt"} <= {r["method"] for r in t["rows"]}
               for t in steps["tables"])
    packing = _part(out, "device_packing")
    assert [(r["model"], r["K"]) for r in packing["tables"][0]["rows"]] == [("t5-base-shape", 1), ("t5-base-shape", 2)]
    assert not (out / "device_serving.json").exists()
    trials = _part(out, "device_sweep")["tables"][0]["rows"]
    assert len(trials) == 4 and {r["seed"] for r in trials} == {0, 1, 2, 3}
    assert {(r["dtype"], r["precision"], r["steps"]) for r in trials} == {("bfloat16", "bf16", 2)}
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["name"] == "cpu-smoke" and run["machine"]["gpu"].startswith("none")
    assert "device_sweep" in (out / "report.md").read_text()


def test_gpu_mode_sizes_are_the_issues():
    from benchmarks.device_check import gpu_mode

    mode = gpu_mode()
    assert (mode.device, mode.dtype, mode.t5_changes) == ("cuda", "bfloat16", {})
    assert [(a["arch"], a["changes"], a.get("methods")) for a in mode.archs] == [
        ("t5-base", {}, None), ("llama-3.2-1b", {}, None), ("qwen2.5-1.5b", {}, None)]
    assert mode.pack_ks == [1, 4, 16] and max(n for counts in mode.serve_counts.values() for n in counts) == 1000
    assert (mode.sweep_gpus, mode.sweep_register) == (0.25, True)
    assert "train.cpu=false" in mode.job_overrides() and "train.precision=bf16" in mode.job_overrides()
