"""Small job configs for the pipeline tests (generated data, tiny models, seconds per job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config.load import load_job_config
from pipelines.config.schema import JobConfig


def tiny_job(output_dir: Path, model_name: str = "tiny-t5", method_name: str = "capt", *overrides: str,
             **sections: Any) -> JobConfig:
    """A job on generated RTE data small enough that one batch is the whole training set.

    `sections` update the named sections (`train={"max_steps": 5}`); `overrides` are key=value strings.
    """
    base = {
        "model": {"name": model_name, "max_length": 96},
        "task": {"name": "rte", "source": "generated", "generated_size": 16, "max_eval_examples": 8},
        "method": {"name": method_name},
        "train": {"batch_size": 16, "eval_batch_size": 8, "max_epochs": 30, "eval_every_steps": 10,
                  "eval_mode": "rank", "patience": None},
        "output_dir": str(output_dir),
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update({k: v for k, v in value.items() if v is not None})
        else:
            base[key] = value
    return load_job_config(None, list(overrides), base=base)
