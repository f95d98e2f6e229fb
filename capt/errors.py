"""Exceptions raised by `capt`: each message names the key, the value given and what is allowed."""


class CaptError(Exception):
    """Base class of every error `capt` raises on bad input."""


class CapsuleConfigError(CaptError, ValueError):
    """A `CapsuleConfig` (or a combination of its fields) is invalid."""


class UnsupportedModelError(CaptError, ValueError):
    """The model's architecture is not in the `capt.arch` registry."""


class CapsuleArtifactError(CaptError, ValueError):
    """A capsule artifact is missing, corrupt, or does not fit the base model it is loaded onto."""
