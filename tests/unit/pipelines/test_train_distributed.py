"""Two processes (`accelerate launch`, gloo) train the same capsule as one process (torchrun) with the same global
batch; `accelerate launch` of the job joins its two processes; a launch whose processes Accelerate does not join
stops on every rank with a message that says how to launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipelines.services import LOCALHOST, free_port
from pipelines.training.setup import LaunchMismatchError, check_launch

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "helpers" / "ddp_job.py"
CPU_2PROC = ROOT / "infra" / "accelerate" / "cpu_2proc.yaml"
ACCELERATE = Path(sys.executable).with_name("accelerate")
JOB = ["model.name=tiny-t5", "task.source=generated", "task.generated_size=32", "task.max_eval_examples=8",
       "train.batch_size=8", "train.eval_batch_size=8", "train.max_steps=6", "train.eval_every_steps=6",
       "train.eval_mode=rank", "model.max_length=96", "method.options.init=normal"]


def _launch(processes: int, output_dir: Path) -> tuple[subprocess.Popen, Path]:
    """Start torchrun on the job, its output to ``<output_dir>.log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               str(SCRIPT), str(output_dir), *JOB]
    log = output_dir.with_suffix(".log")
    with log.open("w") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT), log


def _finish(*launches: tuple[subprocess.Popen, Path]) -> None:
    """Wait for every launch, then check each exited 0."""
    for proc, _ in launches:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for proc, log in launches:
        assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    # side by side: the one-process job uses the CPU the two ranks leave while one waits for the other's checkpoint.
    # The two ranks are launched as `ACCELERATE_USE_CPU=1 accelerate launch` (the launch the job's message names).
    _finish(_launch(1, tmp_path / "one"), _accelerate_popen(tmp_path / "two", late_rank=1))
    single = load_file(str(tmp_path / "one" / "rank0.safetensors"))
    rank0 = load_file(str(tmp_path / "two" / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "two" / "rank1.safetensors"))
    assert set(single) == set(rank0) == {"capsules.0.vectors"}
    for name in single:
        assert torch.equal(rank0[name], rank1[name]), "parameters must stay in sync across ranks"
        torch.testing.assert_close(rank0[name], single[name], atol=1e-5, rtol=1e-4)
    assert (tmp_path / "two" / "artifact" / "capsule.safetensors").is_file()
    result = json.loads((tmp_path / "two" / "result.json").read_text())
    assert result["processes"] == 2 and result["ranks_in_sync"] is True
    assert not (tmp_path / "two" / "rank2.safetensors").exists()
    checkpoints = tmp_path / "two" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest"], "no half-written checkpoint is left"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (checkpoints / "latest").iterdir()}


def _accelerate(arguments: list[str], use_cpu: bool) -> tuple[list[str], dict[str, str]]:
    """The command `accelerate launch --config_file infra/accelerate/cpu_2proc.yaml ARGUMENTS` and its environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("ACCELERATE_USE_CPU", None)
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    # A free rendezvous port: the config's default (29500) would collide with a launch in another test process.
    command = [str(ACCELERATE), "launch", "--config_file", str(CPU_2PROC),
               "--main_process_port", str(free_port(LOCALHOST)), *arguments]
    return command, env


def _accelerate_popen(output_dir: Path, late_rank: int) -> tuple[subprocess.Popen, Path]:
    """`ACCELERATE_USE_CPU=1 accelerate launch ...` of the rank-saving job (`_launch`'s script), its output to
    ``<output_dir>.log``; ``late_rank`` reaches every checkpoint save late (the other rank must wait for it)."""
    command, env = _accelerate([str(SCRIPT), str(output_dir), *JOB], use_cpu=True)
    env["DDP_JOB_LATE_CHECKPOINT_RANK"] = str(late_rank)
    log = output_dir.with_suffix(".log")
    with log.open("w") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT), log


def _accelerate_launch(target: list[str], output_dir: Path, use_cpu: bool) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file infra/accelerate/cpu_2proc.yaml TARGET --config smoke.yaml ...`."""
    command, env = _accelerate([*target, "--config", str(ROOT / "pipelines" / "configs" / "job" / "smoke.yaml"),
                                f"output_dir={output_dir}", *JOB], use_cpu)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.mark.slow
def test_accelerate_launch_of_the_job_joins_two_processes(tmp_path):
    # Without CUDA the launch leaves ACCELERATE_USE_CPU unset: the job itself asks Accelerate for the CPU (the
    # launch with ACCELERATE_USE_CPU=1 is test_two_processes_match_one_process's). With CUDA it sets it: without it
    # or train.cpu=true the job runs on the GPUs. Both ranks run in one job folder: only the main process locks it
    # (a second rank taking the lock would fail the job as "in use").
    done = _accelerate_launch(["-m", "pipelines.train"], tmp_path / "job", use_cpu=torch.cuda.is_available())
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["processes"] == 2 and result["ranks_in_sync"] is True


@pytest.mark.slow
def test_launch_that_accelerate_does_not_join_stops_every_rank(tmp_path):
    # A script of the user's that touches Accelerate before the job (here: PartialState() without cpu=True)
    # leaves each of the launcher's two processes alone as rank 0 of 1; they used to train twice, silently.
    script = tmp_path / "my_train.py"
    script.write_text("import sys\nfrom accelerate import PartialState\nPartialState()\n"
                      "from pipelines.train import main\nsys.exit(main(sys.argv[1:]))\n")
    done = _accelerate_launch([str(script)], tmp_path / "job", use_cpu=False)
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    for rank in (0, 1):  # every rank stops with the message
        assert f"The launcher started 2 processes (WORLD_SIZE=2, RANK={rank})" in message
    assert "Accelerate joined 1 (distributed type NO)" in message
    assert "torchrun --standalone --nproc_per_node 2 -m pipelines.train" in message
    assert "ACCELERATE_USE_CPU=1 accelerate launch" in message
    assert not (tmp_path / "job" / "result.json").exists() and not (tmp_path / "job" / "checkpoints").exists()


@pytest.mark.parametrize("variable", ["WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"])
def test_check_launch_compares_the_launcher_world_size(monkeypatch, variable):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    check_launch(1, "NO")  # no launcher: nothing to compare
    monkeypatch.setenv(variable, "2")
    check_launch(2, "MULTI_CPU")
    with pytest.raises(LaunchMismatchError, match="started 2 processes .* joined 1"):
        check_launch(1, "NO")
