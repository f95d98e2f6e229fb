"""`ServeSettings`: what the Serve app serves and how it batches, from the CLI or a Serve config's ``args``."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError
from pydantic.dataclasses import dataclass

from pipelines.config.schema import STRICT
from pipelines.config.sources import JobConfigError


@dataclass(config=STRICT)
class ServeSettings:
    """One Serve application: the capsules of one base model, their alias, batching and reload."""

    model: str
    """Base model name or slug (google-t5/t5-base or t5-base): serves the registered models capt-<slug>-<task>."""
    tasks: list[str]
    """Tasks to serve; each needs a registered model with a version at `alias`."""
    tracking_uri: str
    """MLflow tracking server that holds the registry (no credentials in it: they come from the environment)."""
    alias: str = "champion"
    """Registry alias whose version is served; a moved alias is picked up at the next poll."""
    poll_s: PositiveFloat = 30.0
    """Seconds between two reads of the aliases."""
    max_rows_per_request: PositiveInt = 64
    """Most task rows in one request; larger requests get HTTP 413."""
    max_batch_requests: PositiveInt = 16
    """Most requests Serve batches together into one mixed batch (`serve.batch` max_batch_size)."""
    batch_wait_s: float = Field(0.01, ge=0.0)
    """How long a batch waits for more requests once the first arrived (`serve.batch` batch_wait_timeout_s)."""
    num_replicas: PositiveInt = 1
    """Replicas; each holds one copy of the base model and every capsule."""
    num_cpus: float = Field(1.0, gt=0.0)
    """CPUs each replica reserves."""
    num_gpus: float = Field(0.0, ge=0.0)
    """GPUs each replica reserves (0: CPU)."""

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ServeSettings:
        """Build from a Serve config's ``args`` (or the CLI's), every problem named at once."""
        try:
            return cls(**args)
        except (ValidationError, TypeError) as err:
            raise JobConfigError(f"Serve settings: {_problems(err)}. Allowed keys: "
                                 f"{', '.join(cls.__dataclass_fields__)}.") from err


def _problems(err: Exception) -> str:
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']} (given {e.get('input')!r})"
                         for e in err.errors())
    return str(err)
