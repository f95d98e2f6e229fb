"""Exceptions raised by `capt`: each message names the key, the value given and what is allowed.

Every error derives from `CaptError`; each also derives from the built-in error a caller would expect
(`ValueError`, `TypeError`, `FileExistsError`, ...), so `except ValueError` keeps working.
"""


class CaptError(Exception):
    """Base class of every error the project raises on bad input (`capt` and the pipelines' own errors).

    Its message is meant for the user as it stands: the entry points print it as one paragraph and exit 2.
    """


class ConfigError(CaptError, ValueError):
    """A config of the library (or a combination of its fields) is invalid; raised by `Problems`."""


class CapsuleConfigError(ConfigError):
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


class ArtifactIntegrityError(ArtifactError):
    """An artifact's files do not match their digest manifest, or the digest recorded for the artifact."""


class CapsuleIntegrityError(ArtifactIntegrityError, CapsuleArtifactError):
    """A capsule artifact's files do not match their digests (`capt.digest`)."""


class AdapterIntegrityError(ArtifactIntegrityError, AdapterError):
    """An adapter artifact's files do not match their digests (`capt.digest`)."""


class CapsuleExistsError(CapsuleArtifactError, FileExistsError):
    """Saving would replace an existing capsule artifact without `overwrite=True`."""


class AdapterExistsError(AdapterError, FileExistsError):
    """Saving would replace an existing adapter artifact without `overwrite=True`."""


class UnknownConfigError(CaptError, TypeError):
    """An object given as a method config is not the config class of any registered method."""
class Problems:
    """The one validation idiom of the library's configs: collect every problem, then raise them together.

    Each problem reads ``key=value (allowed: ...)`` (``key=value with other=value (allowed: ...)`` for a
    combination); `raise_if_any` raises `error` with one paragraph ``Invalid <owner>: p1; p2.``
    """

    def __init__(self, owner: str, error: type[ConfigError] = ConfigError) -> None:
        self.owner = owner
        self.error = error
        self.items: list[str] = []

    def add(self, key: str, value: object, allowed: str, given_with: str = "") -> None:
        """Record `key`=`value` as invalid; `allowed` says what would be accepted, `given_with` the other
        field that makes the combination invalid (e.g. ``"task_vector=False"``)."""
        combined = f" with {given_with}" if given_with else ""
        self.items.append(f"{key}={value!r}{combined} (allowed: {allowed})")

    def require(self, ok: bool, key: str, value: object, allowed: str) -> None:
        """Record `key`=`value` as invalid unless `ok`."""
        if not ok:
            self.add(key, value, allowed)

    def unknown_keys(self, given: object, known: list[str]) -> None:
        """Record the keys of `given` that are not fields (`known`, listed as the allowed ones)."""
        unknown = sorted(set(given) - set(known))  # type: ignore[call-overload]
        if unknown:
            self.items.append(f"unknown keys {unknown} (allowed: {known or 'none'})")

    def raise_if_any(self) -> None:
        """Raise one `error` naming every recorded problem; nothing when there is none."""
        if self.items:
            raise self.error(f"Invalid {self.owner}: " + "; ".join(self.items) + ".")
