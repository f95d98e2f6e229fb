"""Baseline adapter artifacts: ``adapter.safetensors`` + ``adapter.json`` in one directory.

The JSON holds the method, its config and the base model's shape (model type, family, layer count, hidden
size) plus the tensor names and shapes. Writing and validation are `capt.artifact`'s, shared with capsules:
loading checks all of it against the base model before touching any weight, rejects unknown JSON keys,
and reads tensors with safetensors only (never unpickles); saving refuses to overwrite an existing
artifact unless ``overwrite=True`` and writes through temporary files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from capt import artifact
from capt.baselines.info import model_info
from capt.errors import AdapterError, AdapterExistsError, CaptError

if TYPE_CHECKING:
    from capt.baselines.adapted import AdaptedModel

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "adapter.safetensors"
META_NAME = "adapter.json"
FORMAT = "capt-baseline-adapter"
FORMAT_VERSION = 1
BASE_KEYS = ("model_type", "family", "num_layers", "hidden_size")
"""The base model's shape as recorded in ``adapter.json`` and checked on load."""


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
)
"""The adapter artifact of every baseline method."""

META_KEYS = frozenset(ADAPTER.field_types)


def _metadata(model: AdaptedModel, state: dict[str, Any]) -> dict[str, Any]:
    info = model.info
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "method": model.method,
        "config": model.artifact_config().to_dict(), "model_type": info.model_type, "family": info.family,
        "num_layers": info.num_layers, "hidden_size": info.hidden_size,
        "tensors": {name: list(t.shape) for name, t in state.items()},
    }


def save_adapter(model: AdaptedModel, directory: str | Path, overwrite: bool = False) -> Path:
    """Write ``model``'s adapter into ``directory`` (created if needed) and return the directory."""
    state = model.adapter_state_dict()
    artifact.write_artifact(ADAPTER, directory, state, _metadata(model, state),
                            {"format": FORMAT, "method": model.method}, overwrite)
    logger.info("saved %s adapter (%d tensors) to %s", model.method, len(state), directory)
    return Path(directory)


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """Read and structurally validate ``adapter.json``; raise ``AdapterError`` on any problem."""
    return artifact.read_metadata(ADAPTER, directory)


def check_compatible(meta: dict[str, Any], base_model: nn.Module, directory: str | Path = "") -> None:
    """Raise ``AdapterError`` listing every difference between the artifact's base model and ``base_model``."""
    info = model_info(base_model)
    artifact.check_base(ADAPTER, directory, meta, {key: getattr(info, key) for key in BASE_KEYS})


def load_adapter(base_model: nn.Module, directory: str | Path) -> AdaptedModel:
    """Rebuild the saved method on ``base_model`` and load its weights; raise ``AdapterError`` on mismatch."""
    from capt.baselines.adapted import AdaptedModel
    from capt.methods import METHODS, apply_method

    meta = read_metadata(directory)
    entry = METHODS.get(meta["method"])
    if entry is None or not issubclass(entry.model_class, AdaptedModel):
        known = sorted(name for name, e in METHODS.items() if issubclass(e.model_class, AdaptedModel))
        raise AdapterError(f"{Path(directory) / META_NAME}: method={meta['method']!r} (allowed: {known})")
    check_compatible(meta, base_model, directory)
    try:
        config = entry.config_class.from_dict(meta["config"])
    except (CaptError, TypeError, ValueError) as exc:
        raise AdapterError(f"{Path(directory) / META_NAME}: bad config ({exc})") from exc
    state = artifact.read_tensors(ADAPTER, directory, meta["tensors"])
    adapted = apply_method(base_model, config)
    try:
        adapted.load_adapter_state_dict(state)
    except ValueError as exc:
        adapted.detach()
        raise AdapterError(str(exc)) from exc
    logger.info("loaded %s adapter from %s", meta["method"], directory)
    return adapted
