"""The capsule artifact: `capsule.safetensors` + `capsule.json`. Nothing is ever unpickled."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from capt.arch import spec_for
from capt.atomic import write_atomically
from capt.capsule import Capsule
from capt.config import CapsuleConfig
from capt.errors import CapsuleArtifactError, CapsuleConfigError
from capt.fingerprint import fingerprint
from capt.inject import CapsuleModel

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "capsule.safetensors"
METADATA_NAME = "capsule.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CapsuleMetadata:
    """What `capsule.json` records about a capsule and the base model it was trained on."""

    format_version: int
    """Artifact format version."""
    capt_version: str
    """Version of the `capt` package that wrote the artifact."""
    config: dict[str, Any]
    """The `CapsuleConfig` as a dict."""
    layers: list[int]
    """Resolved 0-based capsule layer indices."""
    base_model: str
    """Base model name or path (`config._name_or_path`)."""
    model_type: str
    """The base model's `config.model_type`."""
    num_layers: int
    """Layers in the capsule-hosting stack of the base model."""
    hidden_size: int
    """Hidden size d of the base model."""
    fingerprint: str
    """Fingerprint of the base model's parameter names, shapes and sampled values."""
    task: str | None = None
    """Task the capsule was trained for."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Evaluation metrics recorded at save time."""

    @classmethod
    def from_json(cls, data: Any, path: Path) -> CapsuleMetadata:
        """Parse `capsule.json`, naming unknown and missing keys."""
        if not isinstance(data, dict):
            raise CapsuleArtifactError(f"{path}: expected a JSON object, got {type(data).__name__}.")
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        problems = []
        if unknown := sorted(set(data) - known):
            problems.append(f"unknown keys {unknown} (allowed keys: {sorted(known)})")
        if missing := sorted(required - set(data)):
            problems.append(f"missing keys {missing}")
        problems.extend(_type_problems(data))
        if problems:
            raise CapsuleArtifactError(f"{path} is not a valid capsule description: {'; '.join(problems)}.")
        return cls(**data)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "format_version": (int,), "capt_version": (str,), "config": (dict,), "layers": (list,),
    "base_model": (str,), "model_type": (str,), "num_layers": (int,), "hidden_size": (int,),
    "fingerprint": (str,), "task": (str, type(None)), "metrics": (dict,),
}


def _type_problems(data: dict[str, Any]) -> list[str]:
    """Values of the wrong JSON type, and a format newer than this package reads."""
    problems = [
        f"{key}={data[key]!r} (allowed: {' or '.join(t.__name__ for t in types)})"
        for key, types in _FIELD_TYPES.items()
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool))
    ]
    if isinstance(data.get("layers"), list) and not all(isinstance(i, int) for i in data["layers"]):
        problems.append(f"layers={data['layers']!r} (allowed: a list of ints)")
    if isinstance(data.get("format_version"), int) and data["format_version"] > FORMAT_VERSION:
        problems.append(f"format_version={data['format_version']} (this capt reads up to {FORMAT_VERSION})")
    return problems


def save_capsule(model: CapsuleModel, directory: str | os.PathLike, task: str | None = None,
                 metrics: dict[str, float] | None = None, overwrite: bool = False) -> Path:
    """Write the capsule of a single-capsule `model` to `directory`; refuses to replace one unless asked."""
    if len(model.capsules) != 1:
        raise CapsuleArtifactError(f"save_capsule saves one capsule; this model holds {len(model.capsules)}.")
    directory = Path(directory)
    if (directory / METADATA_NAME).exists() and not overwrite:
        raise CapsuleArtifactError(f"{directory} already holds a capsule; pass overwrite=True to replace it.")
    capsule = model.capsules[0]
    metadata = _metadata_for(model.base_model, capsule, task, metrics)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in capsule.state_dict().items()}
    directory.mkdir(parents=True, exist_ok=True)
    # Write to temporary files first so a crash never leaves a half-written artifact behind.
    write_atomically(directory / WEIGHTS_NAME, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    write_atomically(directory / METADATA_NAME, json.dumps(asdict(metadata), indent=2, sort_keys=True))
    logger.info("Saved capsule (%d parameters) to %s", sum(t.numel() for t in tensors.values()), directory)
    return directory


def _metadata_for(base: nn.Module, capsule: Capsule, task, metrics) -> CapsuleMetadata:
    from capt import __version__

    spec = spec_for(base)
    return CapsuleMetadata(
        format_version=FORMAT_VERSION,
        capt_version=__version__,
        config=capsule.config.to_dict(),
        layers=list(capsule.layers),
        base_model=str(getattr(base.config, "_name_or_path", "") or type(base).__name__),
        model_type=base.config.model_type,
        num_layers=spec.num_layers(base),
        hidden_size=spec.hidden_size(base),
        fingerprint=fingerprint(base),
        task=task,
        metrics={k: float(v) for k, v in (metrics or {}).items()},
    )


def read_metadata(directory: str | os.PathLike) -> CapsuleMetadata:
    """Parse and validate `capsule.json` of an artifact directory without touching any model."""
    folder = Path(directory)
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        raise CapsuleArtifactError(f"No capsule artifact at {folder}: it {what}. Pass the folder that holds "
                                   f"{METADATA_NAME} and {WEIGHTS_NAME}.")
    path = folder / METADATA_NAME
    if not path.is_file():
        raise CapsuleArtifactError(f"No capsule artifact at {directory}: {path.name} is missing.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CapsuleArtifactError(f"{path} is not valid JSON ({err}); the artifact is corrupt.") from err
    return CapsuleMetadata.from_json(data, path)


def read_capsule(base_model: nn.Module, directory: str | os.PathLike, strict: bool = True
                 ) -> tuple[Capsule, CapsuleMetadata]:
    """Validate an artifact against `base_model` and build its `Capsule` (not yet attached)."""
    metadata = read_metadata(directory)
    _check_base(base_model, metadata, Path(directory), strict)
    try:
        config = CapsuleConfig.from_dict(metadata.config)
        expected = config.resolve_layers(metadata.num_layers)
        config.check_hidden_size(metadata.hidden_size)
    except CapsuleConfigError as err:
        raise CapsuleArtifactError(f"{Path(directory) / METADATA_NAME}: {err}") from err
    if tuple(metadata.layers) != expected:  # checked before anything touches the base model
        raise CapsuleArtifactError(
            f"{Path(directory) / METADATA_NAME}: layers={metadata.layers} does not match its config (layers="
            f"{config.to_dict()['layers']!r} on a {metadata.num_layers}-layer model gives {list(expected)}); "
            "the artifact is corrupt.")
    device = next(base_model.parameters()).device
    capsule = Capsule(config, tuple(metadata.layers), metadata.hidden_size, device=device)
    _load_weights(capsule, Path(directory) / WEIGHTS_NAME)
    return capsule, metadata


def load_capsule(base_model: nn.Module, directory: str | os.PathLike, strict: bool = True) -> CapsuleModel:
    """Attach the capsule saved in `directory` to `base_model` (which must be the model it was trained on).

    `strict=False` accepts a base model whose weights differ (same architecture) with a warning.
    """
    capsule, metadata = read_capsule(base_model, directory, strict)
    return CapsuleModel(base_model, [capsule], names=[metadata.task or "default"])


def _check_base(base: nn.Module, meta: CapsuleMetadata, directory: Path, strict: bool) -> None:
    spec = spec_for(base)
    actual = {"model_type": base.config.model_type, "num_layers": spec.num_layers(base),
              "hidden_size": spec.hidden_size(base)}
    wrong = [f"{key}: capsule has {getattr(meta, key)!r}, model has {value!r}"
             for key, value in actual.items() if getattr(meta, key) != value]
    if wrong:
        raise CapsuleArtifactError(
            f"The capsule in {directory} was trained on {meta.base_model!r} and does not fit this model ("
            + "; ".join(wrong) + ")."
        )
    _check_fingerprint(fingerprint(base), meta, directory, strict)


def _check_fingerprint(current: str, meta: CapsuleMetadata, directory: Path, strict: bool) -> None:
    saved_structure, _, saved_values = meta.fingerprint.partition(":")
    structure, _, values = current.partition(":")
    if structure != saved_structure:
        raise CapsuleArtifactError(
            f"The capsule in {directory} was trained on {meta.base_model!r}, whose parameter names or shapes "
            "differ from this model's; load it onto that base model."
        )
    if "meta" in (values, saved_values) or values == saved_values:
        return
    message = (f"The capsule in {directory} was trained on {meta.base_model!r}, whose weights differ from this "
               "model's (same architecture, other checkpoint)")
    if strict:
        raise CapsuleArtifactError(message + "; pass strict=False to load it anyway.")
    logger.warning("%s; loading anyway because strict=False.", message)


def _load_weights(capsule: Capsule, path: Path) -> None:
    if not path.is_file():
        raise CapsuleArtifactError(f"No capsule weights at {path}: the artifact is incomplete.")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CapsuleArtifactError(f"{path} is not a readable safetensors file ({err}); the artifact is corrupt.") from err
    expected = {name: tuple(t.shape) for name, t in capsule.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if expected != found:
        raise CapsuleArtifactError(f"{path} holds tensors {found}, but its capsule.json implies {expected}.")
    if any(not torch.isfinite(t).all() for t in tensors.values()):
        raise CapsuleArtifactError(f"{path} holds NaN or infinite values; the artifact is corrupt.")
    with torch.no_grad():
        for name, param in capsule.named_parameters():
            param.copy_(tensors[name])
