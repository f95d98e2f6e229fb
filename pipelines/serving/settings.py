"""`ServeSettings`: what the Serve app serves and how it batches, from the CLI or a Serve config's ``args``."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveInt, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from pipelines.config.schema import STRICT, NonNegativeFloat, PositiveFloat
from pipelines.config.sources import PipelineConfigError


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
    all_tasks: bool = False
    """Follow the registry (``--all``): a task whose registered model gets a version at `alias` after the start is
    served from the next poll on. False: only `tasks` are served. Either way a task whose registered model is
    deleted, or loses the alias, is no longer served (its requests get 400) until it has a version at `alias` again."""
    poll_s: PositiveFloat = 30.0
    """Seconds between two reads of the registry (moved aliases, new and deleted tasks)."""
    max_rows_per_request: PositiveInt = 64
    """Most task rows in one request; larger requests get HTTP 413."""
    max_body_bytes: int = Field(2**20, ge=1024)
    """Most bytes in one request body (1 MiB: 64 rows of long SuperGLUE passages fit several times); more is 413."""
    max_text_chars: PositiveInt | None = None
    """Most characters in one string of a row; None: 8 x the capsule's max_length in tokens (English text
    averages about 4 characters a token: 8x refuses nothing the model would have read, however the text splits)."""
    max_json_depth: int = Field(16, ge=8)
    """Deepest nesting of objects and lists in a body (a MultiRC row in its request needs 8)."""
    auth: bool = True
    """Require a bearer token on every route but /health; false only when asked for (--no-auth)."""
    token_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")
    """SHA-256 (hex) of the bearer token; the token itself never enters the settings (pipelines.serving.auth)."""
    max_batch_requests: PositiveInt = 16
    """Most requests Serve batches together into one mixed batch (`serve.batch` max_batch_size)."""
    batch_wait_s: NonNegativeFloat = 0.01
    """How long a batch waits for more requests once the first arrived (`serve.batch` batch_wait_timeout_s)."""
    num_replicas: PositiveInt = 1
    """Replicas; each holds one copy of the base model and every capsule."""
    num_cpus: PositiveFloat = 1.0
    """CPUs each replica reserves."""
    num_gpus: NonNegativeFloat = 0.0
    """GPUs each replica reserves (0: CPU)."""

    @model_validator(mode="after")
    def _token_when_auth(self) -> ServeSettings:
        if self.auth and self.token_sha256 is None:
            raise ValueError("auth is on but no token_sha256 is given: give the token's SHA-256 (the CLI and a Serve "
                             "config's CAPT_SERVE_TOKEN / token_file do it), or set auth: false explicitly")
        return self

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ServeSettings:
        """Build from a Serve config's ``args`` (or the CLI's), every problem named at once."""
        try:
            return cls(**args)
        except (ValidationError, TypeError) as err:
            problems = str(err) if isinstance(err, TypeError) else "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']} (given {e.get('input')!r})"
                for e in err.errors())
            raise PipelineConfigError(f"Serve settings: {problems}. Allowed keys: "
                                      f"{', '.join(cls.__dataclass_fields__)}.") from err
