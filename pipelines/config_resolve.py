"""A job config with every default filled in, as every consumer (training, result.json, MLflow, the hash) sees it."""

from __future__ import annotations

from pipelines.config import JobConfig
from pipelines.optim_defaults import resolve_optim
from pipelines.readout import resolve_readout


def resolve_job(config: JobConfig) -> JobConfig:
    """`config` with the optimiser (`pipelines.optim_defaults`) and the readout (`pipelines.readout`) resolved."""
    return resolve_readout(resolve_optim(config))
