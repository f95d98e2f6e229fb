"""Capsule Prompt-Tuning: one trainable vector per layer on a frozen Hugging Face model."""

from importlib.metadata import PackageNotFoundError, version

from capt.bank import CapsuleBank
from capt.config import CapsuleConfig
from capt.errors import CapsuleArtifactError, CapsuleConfigError, CaptError, UnsupportedModelError
from capt.inject import CapsuleModel, attach
from capt.io import CapsuleMetadata, load_capsule, read_metadata, save_capsule

try:
    __version__ = version("capt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CaptError",
    "CapsuleBank",
    "CapsuleMetadata",
    "CapsuleArtifactError",
    "CapsuleConfig",
    "CapsuleConfigError",
    "CapsuleModel",
    "UnsupportedModelError",
    "__version__",
    "attach",
    "load_capsule",
    "read_metadata",
    "save_capsule",
]
