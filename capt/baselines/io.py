"""Baseline adapter artifacts: ``adapter.safetensors`` + ``adapter.json`` in one directory.

The JSON holds the method, its config and the base model's shape (model type, family, layer count, hidden
size) plus the tensor names and shapes. Writing and validation are `capt.artifact`'s, shared with capsules:
loading checks all of it against the base model before touching any weight, rejects unknown JSON keys,
and reads tensors with safetensors only (never unpickles); saving refuses to overwrite an existing
artifact unless ``overwrite=True`` and writes through temporary files.

This module reads, writes and checks the files and returns plain data (tensors, the parsed JSON, the
method config); it builds no model: ``AdaptedModel.save_adapter`` and ``load_adapter`` (in
``capt.baselines.adapted``) do that from what it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from capt import artifact
from capt.baselines.info import ModelInfo, model_info
from capt.errors import AdapterError, AdapterExistsError, AdapterIntegrityError, CaptError

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "adapter.safetensors"
META_NAME = "adapter.json"
FORMAT = "capt-baseline-adapter"
FORMAT_VERSION = 1
BASE_KEYS = ("model_type", "family", "num_layers", "hidden_size")
"""The base model's shape as recorded in ``adapter.json`` and checked on load."""
ConfigT = TypeVar("ConfigT")


def _value_problems(meta: dict[str, Any]) -> list[str]:
    problems = []
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        problems.append(f"format={meta.get('format')!r} format_version={meta.get('format_version')!r} "
                        f"(allowed: {FORMAT!r} version {FORMAT_VERSION})")
    tensors = meta.get("tensors")
    if isinstance(tensors, dict) and not all(
            isinstance(s, list) and all(isinstance(n, int) for n in s) for s in tensors.values()):
        problems.append(f"tensors={tensors!r} (allowed: tensor name -> list of ints)")
    return problems


ADAPTER = artifact.ArtifactKind(
    name="adapter", weights_name=WEIGHTS_NAME, metadata_name=META_NAME,
    field_types={"format": (str,), "format_version": (int,), "method": (str,), "config": (dict,),
                 "model_type": (str,), "family": (str,), "num_layers": (int,), "hidden_size": (int,),
                 "tensors": (dict,)},
    required=frozenset({"format", "format_version", "method", "config", *BASE_KEYS, "tensors"}),
    error=AdapterError, exists_error=AdapterExistsError, value_problems=_value_problems,
    integrity_error=AdapterIntegrityError,
)
"""The adapter artifact of every baseline method."""

META_KEYS = frozenset(ADAPTER.field_types)


def describe(method: str, config: Mapping[str, Any], info: ModelInfo,
             tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """What ``adapter.json`` records: the method, its config as a dict, the base model's shape, tensor shapes."""
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "method": method, "config": dict(config),
        "model_type": info.model_type, "family": info.family, "num_layers": info.num_layers,
        "hidden_size": info.hidden_size, "tensors": {name: list(t.shape) for name, t in tensors.items()},
    }


def write_adapter(directory: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any],
                  overwrite: bool = False) -> Path:
    """Write an adapter (``tensors`` and ``describe``'s ``metadata``) into ``directory`` (created if needed)."""
    artifact.write_artifact(ADAPTER, directory, tensors, metadata,
                            {"format": FORMAT, "method": metadata["method"]}, overwrite)
    logger.info("saved %s adapter (%d tensors) to %s", metadata["method"], len(tensors), directory)
    return Path(directory)


def verify(directory: str | Path) -> str | None:
    """Verify the adapter's files against its digest manifest (`capt.digest`); its artifact digest, or None
    (with a warning) for an adapter written before manifests."""
    return artifact.verify_artifact(ADAPTER, directory)


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """Read and structurally validate ``adapter.json``; raise ``AdapterError`` on any problem."""
    return artifact.read_metadata(ADAPTER, directory)


def check_compatible(meta: dict[str, Any], base_model: nn.Module, directory: str | Path = "") -> None:
    """Raise ``AdapterError`` listing every difference between the artifact's base model and ``base_model``."""
    info = model_info(base_model)
    artifact.check_base(ADAPTER, directory, meta, {key: getattr(info, key) for key in BASE_KEYS})


def read_config(meta: dict[str, Any], config_class: type[ConfigT], directory: str | Path) -> ConfigT:
    """The method config recorded in ``meta``, built by ``config_class.from_dict``; ``AdapterError`` if invalid."""
    try:
        return config_class.from_dict(meta["config"])
    except (CaptError, TypeError, ValueError) as exc:
        raise AdapterError(f"{Path(directory) / META_NAME}: bad config ({exc})") from exc


def read_tensors(directory: str | Path, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The adapter tensors in ``directory`` (CPU), which must be exactly those ``meta`` lists and finite."""
    return artifact.read_tensors(ADAPTER, directory, meta["tensors"])
