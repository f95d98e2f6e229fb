"""Capsule Prompt-Tuning: one trainable vector per layer on a frozen Hugging Face model.

Importing this package is light (its errors, for instance, need no torch): the names backed by torch
and transformers are imported on first use.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from capt.errors import (
    AdapterError,
    ArtifactError,
    ArtifactIntegrityError,
    CapsuleArtifactError,
    CapsuleConfigError,
    CaptError,
    MethodError,
    UnknownMethodError,
    UnsupportedModelError,
)

try:
    __version__ = version("capt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "CapsuleBank": "capt.bank",
    "CapsuleConfig": "capt.config",
    "CapsuleMetadata": "capt.io",
    "CapsuleModel": "capt.inject",
    "METHODS": "capt.methods",
    "MethodModel": "capt.methods",
    "apply_method": "capt.methods",
    "attach": "capt.inject",
    "load_capsule": "capt.inject",
    "read_metadata": "capt.io",
    "save_capsule": "capt.inject",
}

__all__ = [
    "METHODS",
    "AdapterError",
    "ArtifactError",
    "ArtifactIntegrityError",
    "CaptError",
    "CapsuleBank",
    "CapsuleMetadata",
    "CapsuleArtifactError",
    "CapsuleConfig",
    "CapsuleConfigError",
    "CapsuleModel",
    "MethodError",
    "MethodModel",
    "UnknownMethodError",
    "UnsupportedModelError",
    "__version__",
    "apply_method",
    "attach",
    "load_capsule",
    "read_metadata",
    "save_capsule",
]


def __getattr__(name: str) -> Any:
    """Import torch-backed names on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'capt' has no attribute {name!r}")
