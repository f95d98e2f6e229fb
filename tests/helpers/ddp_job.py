"""Run one job and save this rank's trained weights; launched by torchrun in the DDP test.

    torchrun --standalone --nproc_per_node 2 tests/helpers/ddp_job.py OUTPUT_DIR key=value ...
"""

from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import save_file

from pipelines.checkpoint import trainable_state
from pipelines.config import load_job_config
from pipelines.job_setup import build_job
from pipelines.train import fit


def main() -> None:
    output_dir, overrides = Path(sys.argv[1]), sys.argv[2:]
    job = build_job(load_job_config(None, [f"output_dir={output_dir}", *overrides]))
    fit(job)
    weights = trainable_state(job.accelerator.unwrap_model(job.model))
    save_file(weights, str(output_dir / f"rank{job.accelerator.process_index}.safetensors"))


if __name__ == "__main__":
    main()
