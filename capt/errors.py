"""Exceptions raised by `capt`: each message names the key, the value given and what is allowed."""


class CaptError(Exception):
    """Base class of every error the project raises on bad input (`capt` and the pipelines' own errors).

    Its message is meant for the user as it stands: the entry points print it as one paragraph and exit 2.
    """


class CapsuleConfigError(CaptError, ValueError):
    """A `CapsuleConfig` (or a combination of its fields) is invalid."""


class UnsupportedModelError(CaptError, ValueError):
    """The model's architecture is not in the `capt.arch` registry."""


class CapsuleArtifactError(CaptError, ValueError):
    """A capsule artifact is missing, corrupt, or does not fit the base model it is loaded onto."""
