"""Baseline adapter artifacts: ``adapter.safetensors`` + ``adapter.json`` in one directory.

The JSON holds the method, its config and the base model's shape (model type, family, layer count, hidden
size) plus the tensor names and shapes. Loading checks all of it against the base model before touching
any weight, rejects unknown JSON keys, and reads tensors with safetensors only (never unpickles). Saving
refuses to overwrite an existing artifact unless ``overwrite=True`` and writes through temporary files.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from capt.atomic import write_atomically
from capt.baselines.info import model_info
from capt.errors import CaptError

if TYPE_CHECKING:
    from capt.baselines.adapted import AdaptedModel

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "adapter.safetensors"
META_NAME = "adapter.json"
FORMAT = "capt-baseline-adapter"
FORMAT_VERSION = 1
META_KEYS = frozenset({"format", "format_version", "method", "config", "model_type", "family", "num_layers",
                       "hidden_size", "tensors"})
MAX_META_BYTES = 1 << 20


class AdapterError(CaptError, ValueError):
    """An adapter artifact is corrupt, malformed or does not fit the base model."""


def _metadata(model: AdaptedModel, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    info = model.info
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "method": model.method,
        "config": model.adapter_config.to_dict(), "model_type": info.model_type, "family": info.family,
        "num_layers": info.num_layers, "hidden_size": info.hidden_size,
        "tensors": {name: list(t.shape) for name, t in state.items()},
    }


def save_adapter(model: AdaptedModel, directory: str | Path, overwrite: bool = False) -> Path:
    """Write ``model``'s adapter into ``directory`` (created if needed) and return the directory."""
    directory = Path(directory)
    targets = [directory / WEIGHTS_NAME, directory / META_NAME]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"adapter artifact already exists: {existing}; pass overwrite=True to replace it")
    directory.mkdir(parents=True, exist_ok=True)
    state = model.adapter_state_dict()
    meta = _metadata(model, state)
    write_atomically(targets[0], lambda p: save_file(state, p, metadata={"format": FORMAT, "method": model.method}))
    write_atomically(targets[1], json.dumps(meta, indent=2, sort_keys=True))
    logger.info("saved %s adapter (%d tensors) to %s", model.method, len(state), directory)
    return directory


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """Read and structurally validate ``adapter.json``; raise ``AdapterError`` on any problem."""
    path = Path(directory) / META_NAME
    if not path.is_file():
        raise AdapterError(f"no adapter metadata at {path}")
    if path.stat().st_size > MAX_META_BYTES:
        raise AdapterError(f"{path} is larger than {MAX_META_BYTES} bytes")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    unknown, missing = sorted(set(meta) - META_KEYS), sorted(META_KEYS - set(meta))
    if unknown or missing:
        raise AdapterError(f"{path}: unknown keys {unknown}, missing keys {missing} (allowed: {sorted(META_KEYS)})")
    if meta["format"] != FORMAT or meta["format_version"] != FORMAT_VERSION:
        raise AdapterError(f"{path}: unsupported format {meta['format']!r} v{meta['format_version']!r}")
    return meta


def check_compatible(meta: dict[str, Any], base_model: nn.Module) -> None:
    """Raise ``AdapterError`` listing every difference between the artifact's base model and ``base_model``."""
    info = model_info(base_model)
    problems = [
        f"{key}: artifact {meta[key]!r}, model {getattr(info, key)!r}"
        for key in ("model_type", "family", "num_layers", "hidden_size")
        if meta[key] != getattr(info, key)
    ]
    if problems:
        raise AdapterError("adapter was saved for a different base model: " + "; ".join(problems))


def read_tensors(directory: str | Path, expected: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Load the safetensors file and check it holds exactly the tensors ``expected`` lists."""
    path = Path(directory) / WEIGHTS_NAME
    if not path.is_file():
        raise AdapterError(f"no adapter weights at {path}")
    try:
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise AdapterError(f"{path} is not a readable safetensors file: {exc}") from exc
    found = {name: list(t.shape) for name, t in state.items()}
    if found != expected:
        raise AdapterError(f"{path} does not match {META_NAME}: file has {found}, metadata lists {expected}")
    return state


def load_adapter(base_model: nn.Module, directory: str | Path) -> AdaptedModel:
    """Rebuild the saved method on ``base_model`` and load its weights; raise ``AdapterError`` on mismatch."""
    from capt.baselines import METHODS, apply

    meta = read_metadata(directory)
    if meta["method"] not in METHODS:
        raise AdapterError(f"unknown method {meta['method']!r} (known: {sorted(METHODS)})")
    check_compatible(meta, base_model)
    try:
        config = METHODS[meta["method"]].from_dict(meta["config"])
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"bad config in {META_NAME}: {exc}") from exc
    state = read_tensors(directory, meta["tensors"])
    adapted = apply(base_model, config)
    try:
        adapted.load_adapter_state_dict(state)
    except ValueError as exc:
        adapted.detach()
        raise AdapterError(str(exc)) from exc
    logger.info("loaded %s adapter from %s", meta["method"], directory)
    return adapted
