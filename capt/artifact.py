"""Method artifacts on disk, for capsules and adapters alike: one safetensors file and one JSON description.

Writing goes through temporary files (a crash never leaves half an artifact), refuses to replace an
existing artifact unless asked, writes the safetensors header in one canonical order (so the same tensors
give the same bytes) and seals the files in a digest manifest (`capt.digest`). Reading first verifies
the files against that manifest (`verify_artifact`), then checks the description's size, keys and value types before any
model is touched, reads tensors with safetensors only (nothing is ever unpickled), and checks every
tensor's name and shape against the description and its values for NaN or infinity.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save_file

from capt import digest
from capt.atomic import write_atomically
from capt.errors import ArtifactError, ArtifactIntegrityError

MAX_METADATA_BYTES = 1 << 20
"""Largest JSON description read (a real one is a few kilobytes)."""


@dataclass(frozen=True)
class ArtifactKind:
    """File names, JSON schema and errors of one kind of artifact."""

    name: str
    """What the artifact holds, as error messages call it: "capsule" or "adapter"."""
    weights_name: str
    """File name of the safetensors tensors."""
    metadata_name: str
    """File name of the JSON description."""
    field_types: Mapping[str, tuple[type, ...]]
    """Every key the description may hold, with the JSON types its value may have."""
    required: frozenset[str]
    """Keys the description must hold."""
    error: type[ArtifactError]
    """Raised for a missing, corrupt or unfitting artifact."""
    exists_error: type[ArtifactError]
    """Raised when saving would replace an artifact without `overwrite=True`."""
    value_problems: Callable[[dict[str, Any]], list[str]] = lambda data: []
    """Problems of values beyond their JSON type (e.g. a format newer than this package reads)."""
    integrity_error: type[ArtifactIntegrityError] = ArtifactIntegrityError
    """Raised when the files do not match their digest manifest."""


def write_artifact(kind: ArtifactKind, directory: str | os.PathLike, tensors: dict[str, torch.Tensor],
                   metadata: dict[str, Any], header: dict[str, str], overwrite: bool) -> Path:
    """Write `tensors` (safetensors, with `header` as its string metadata) and `metadata` (sorted JSON)."""
    directory = Path(directory)
    existing = [name for name in (kind.weights_name, kind.metadata_name) if (directory / name).exists()]
    if existing and not overwrite:
        raise kind.exists_error(f"{directory} already holds a {kind.name} ({', '.join(existing)}); pass "
                                "overwrite=True to replace it.")
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / kind.weights_name, lambda path: _save_canonical(tensors, path, header))
    write_atomically(directory / kind.metadata_name, json.dumps(metadata, indent=2, sort_keys=True))
    digest.seal(directory, (kind.weights_name, kind.metadata_name))
    return directory


def verify_artifact(kind: ArtifactKind, directory: str | os.PathLike) -> str | None:
    """`capt.digest.verify` of the artifact in `directory`: its files must match its manifest (if it has one)."""
    if not Path(directory).is_dir():
        return None  # `read_metadata` says what is wrong with the path
    return digest.verify(directory, f"The {kind.name} artifact at {directory}", error=kind.integrity_error)


def _save_canonical(tensors: dict[str, torch.Tensor], path: str, header: dict[str, str]) -> None:
    """`save_file`, then its JSON header rewritten with the string metadata in sorted key order.

    safetensors writes `__metadata__` from a Rust HashMap, so its key order (and the file's bytes) changes
    from one save to the next; sorted, the same tensors and header always give the same bytes, hence the
    same digest. Tensor entries keep their (already deterministic) order and offsets; the rewritten header
    has the same length (same keys and values, same compact JSON), padded with spaces as safetensors pads.
    """
    save_file(tensors, path, metadata=header)
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        written = json.loads(handle.read(length))
        ordered = {"__metadata__": dict(sorted(written.pop("__metadata__", {}).items())), **written}
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:  # cannot happen for the same content; never leave a wrong header behind
            raise RuntimeError(f"canonical safetensors header of {path} is longer than the written one")
        handle.seek(8)
        handle.write(text + b" " * (length - len(text)))


def read_metadata(kind: ArtifactKind, directory: str | os.PathLike) -> dict[str, Any]:
    """The artifact's JSON description, its keys and value types checked against `kind`; a folder holding a symbolic
    link is refused first (`capt.digest.link_problem`)."""
    folder = Path(directory)
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        raise kind.error(f"No {kind.name} artifact at {folder}: it {what}. Pass the folder that holds "
                         f"{kind.metadata_name} and {kind.weights_name}.")
    if problem := digest.link_problem(folder, f"The {kind.name} artifact at {folder}"):
        raise kind.integrity_error(problem)  # before any file is read through a link
    path = folder / kind.metadata_name
    if not path.is_file():
        raise kind.error(f"No {kind.name} artifact at {directory}: {path.name} is missing.")
    if path.stat().st_size > MAX_METADATA_BYTES:
        raise kind.error(f"{path} is larger than {MAX_METADATA_BYTES} bytes; the artifact is corrupt.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise kind.error(f"{path} is not valid JSON ({err}); the artifact is corrupt.") from err
    if not isinstance(data, dict):
        raise kind.error(f"{path}: expected a JSON object, got {type(data).__name__}.")
    problems = schema_problems(kind, data)
    if problems:
        raise kind.error(f"{path} is not a valid {kind.name} description: {'; '.join(problems)}.")
    return data


def schema_problems(kind: ArtifactKind, data: dict[str, Any]) -> list[str]:
    """Unknown and missing keys, values of the wrong JSON type, and `kind`'s own value problems."""
    problems = []
    if unknown := sorted(set(data) - set(kind.field_types)):
        problems.append(f"unknown keys {unknown} (allowed keys: {sorted(kind.field_types)})")
    if missing := sorted(kind.required - set(data)):
        problems.append(f"missing keys {missing}")
    problems += [
        f"{key}={data[key]!r} (allowed: {' or '.join(t.__name__ for t in types)})"
        for key, types in kind.field_types.items()
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool))
    ]
    return problems + kind.value_problems(data)


SMALL_FILE_BYTES = 64 << 20
"""Safetensors files up to this size are read whole (`read_safetensors`)."""


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file `path`, on the CPU.

    Not `safetensors.torch.load_file` for small files: safetensors 0.8's file reader (`load_file`, `safe_open`) keeps
    one Python object, about 30 bytes, per call for the life of the process (1,000 calls on one file: 1,039 objects
    left, tracemalloc), and a serving replica reads two files per capsule, 1,000s of capsules, among the objects it
    keeps. `safetensors.torch.load` of the file's bytes keeps nothing. Files over `SMALL_FILE_BYTES` (a large
    adapter's) still go through `load_file`, whose mapping of the file spares a second copy of it in memory.
    """
    path = Path(path)
    if path.stat().st_size > SMALL_FILE_BYTES:
        return load_file(str(path), device="cpu")
    return load(path.read_bytes())


def read_tensors(kind: ArtifactKind, directory: str | os.PathLike,
                 expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The artifact's tensors (on the CPU), which must be exactly `expected` (name -> shape) and finite."""
    path = Path(directory) / kind.weights_name
    if not path.is_file():
        raise kind.error(f"No {kind.name} weights at {path}: the artifact is incomplete.")
    try:
        tensors = read_safetensors(path)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise kind.error(f"{path} is not a readable safetensors file ({err}); the artifact is corrupt.") from err
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    expected = {name: tuple(shape) for name, shape in expected.items()}
    if found != expected:
        raise kind.error(f"{path} holds tensors {found}, but its {kind.metadata_name} implies {expected}.")
    if any(not torch.isfinite(t).all() for t in tensors.values()):
        raise kind.error(f"{path} holds NaN or infinite values; the artifact is corrupt.")
    return tensors


def check_base(kind: ArtifactKind, directory: str | os.PathLike, recorded: Mapping[str, Any],
               actual: Mapping[str, Any], trained_on: str | None = None) -> None:
    """Refuse an artifact whose recorded base-model shape (model type, depth, width, ...) differs from `actual`."""
    wrong = [f"{key}: {kind.name} has {recorded[key]!r}, model has {value!r}"
             for key, value in actual.items() if recorded[key] != value]
    if wrong:
        origin = f" was trained on {trained_on!r} and" if trained_on else ""
        raise kind.error(f"The {kind.name} in {directory}{origin} does not fit this model (" + "; ".join(wrong) + ").")
