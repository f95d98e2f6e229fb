"""Run one job and save this rank's trained weights; launched by torchrun in the DDP test.

    torchrun --standalone --nproc_per_node 2 tests/helpers/ddp_job.py OUTPUT_DIR key=value ...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from safetensors.torch import save_file

from pipelines.config.load import load_job_config
from pipelines.training.checkpoint import trainable_state
from pipelines.training.loop import fit
from pipelines.training.setup import build_job

LATE_RANK = "DDP_JOB_LATE_CHECKPOINT_RANK"
"""Environment variable: the rank whose checkpoint saves start 2 s late (a slow filesystem, a busy host)."""


def _delay_checkpoints_of_rank(rank: int, seconds: float) -> None:
    """Make one rank write its share of every checkpoint late: after Accelerate made the folder, before
    it writes the files, so a checkpoint that moves the folder without waiting for all ranks breaks."""
    import accelerate.accelerator

    original = accelerate.accelerator.save_accelerator_state

    def late_save(*args: object, **kwargs: object) -> object:
        if accelerate.PartialState().process_index == rank:
            time.sleep(seconds)
        return original(*args, **kwargs)

    accelerate.accelerator.save_accelerator_state = late_save


def main() -> None:
    output_dir, overrides = Path(sys.argv[1]), sys.argv[2:]
    if LATE_RANK in os.environ:
        _delay_checkpoints_of_rank(int(os.environ[LATE_RANK]), seconds=2.0)
    job = build_job(load_job_config(None, [f"output_dir={output_dir}", *overrides]))
    fit(job)
    model = job.accelerator.unwrap_model(job.model)
    weights = {**trainable_state(model), **model.phase_state()}  # phase state: e.g. XPrompt's masks, per rank
    save_file(weights, str(output_dir / f"rank{job.accelerator.process_index}.safetensors"))


if __name__ == "__main__":
    main()
