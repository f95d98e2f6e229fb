"""A job's configuration: typed sections (`schema`), YAML + `key=value` sources (`sources`), and `load`, THE entry
(cross-field checks and defaults included), which returns the one resolved type every consumer takes.

    from pipelines.config import load_job_config
    config = load_job_config("pipelines/configs/job/smoke.yaml", ["train.max_steps=20"])

Importing this package imports no torch.
"""

from pipelines.config.load import load_job_config, validate_job_config
from pipelines.config.schema import JobConfig, ResolvedJobConfig, require_resolved
from pipelines.config.sources import PipelineConfigError

__all__ = ["JobConfig", "PipelineConfigError", "ResolvedJobConfig", "load_job_config", "require_resolved",
           "validate_job_config"]
