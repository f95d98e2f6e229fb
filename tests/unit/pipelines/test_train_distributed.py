"""Two processes (torchrun, gloo) train the same capsule as one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "helpers" / "ddp_job.py"
JOB = ["model.name=tiny-t5", "task.source=generated", "task.generated_size=32", "task.max_eval_examples=8",
       "train.batch_size=8", "train.eval_batch_size=8", "train.max_steps=6", "train.eval_every_steps=6",
       "train.eval_mode=rank", "model.max_length=96", "method.options.init=normal"]


def _launch(processes: int, output_dir: Path, late_rank: int | None = None) -> None:
    """torchrun the job; ``late_rank`` reaches every checkpoint save late (the others must wait for it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if late_rank is not None:
        env["DDP_JOB_LATE_CHECKPOINT_RANK"] = str(late_rank)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               str(SCRIPT), str(output_dir), *JOB]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    _launch(1, tmp_path / "one")
    _launch(2, tmp_path / "two", late_rank=1)
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
