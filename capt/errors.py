"""Exceptions raised by `capt`: each message names the key, the value given and what is allowed.

Every error derives from `CaptError`; each also derives from the built-in error a caller would expect
(`ValueError`, `TypeError`, `FileExistsError`, ...), so `except ValueError` keeps working.
"""


class CaptError(Exception):
    """Base class of every error the project raises on bad input (`capt` and the pipelines' own errors).

    Its message is meant for the user as it stands: the entry points print it as one paragraph and exit 2.
    """


class CapsuleConfigError(CaptError, ValueError):
    """A `CapsuleConfig` (or a combination of its fields) is invalid."""


class UnsupportedModelError(CaptError, ValueError):
    """The model's architecture is not in the `capt.arch` registry."""


class UnknownMethodError(CaptError, ValueError):
    """A method name that is not in the `capt.methods` registry."""


class MethodError(CaptError, ValueError):
    """A method cannot be applied to this model or these inputs."""


class UnsupportedCallError(MethodError, TypeError):
    """The adapted model cannot do what was asked (e.g. generate text with a classifier)."""


class DetachedError(MethodError, RuntimeError):
    """The method was already removed from its base model."""


class ArtifactError(CaptError, ValueError):
    """A method artifact (capsule or adapter) is missing, corrupt, or does not fit the base model."""


class CapsuleArtifactError(ArtifactError):
    """A capsule artifact is missing, corrupt, or does not fit the base model it is loaded onto."""


class AdapterError(ArtifactError):
    """A baseline adapter artifact is missing, corrupt, or does not fit the base model it is loaded onto."""


class CapsuleExistsError(CapsuleArtifactError, FileExistsError):
    """Saving would replace an existing capsule artifact without `overwrite=True`."""


class AdapterExistsError(AdapterError, FileExistsError):
    """Saving would replace an existing adapter artifact without `overwrite=True`."""


class UnknownConfigError(CaptError, TypeError):
    """An object given as a method config is not the config class of any registered method."""
