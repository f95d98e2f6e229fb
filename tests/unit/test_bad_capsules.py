"""The bad-input matrix, part 3: `capt.load_capsule` on damaged copies of a finished job's capsule.

Each case asserts `CapsuleArtifactError` with a phrase naming the problem in a one-paragraph message,
that neither the damaged folder nor the earlier outputs changed, and that the base model is left as
it was (a capsule still attaches to it afterwards).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.bad_inputs import earlier_outputs, folder_digest
from safetensors.torch import load_file, save_file

import capt
from capt.io import METADATA_NAME, WEIGHTS_NAME
from pipelines.models.loading import load_model

Damage = Callable[[Path], Path]


def _edit_json(change: Callable[[dict], object]) -> Damage:
    def damage(folder: Path) -> Path:
        data = json.loads((folder / METADATA_NAME).read_text(encoding="utf-8"))
        change(data)
        (folder / METADATA_NAME).write_text(json.dumps(data), encoding="utf-8")
        return folder
    return damage


def _write(name: str, data: bytes) -> Damage:
    def damage(folder: Path) -> Path:
        (folder / name).write_bytes(data)
        return folder
    return damage


def _truncate(folder: Path) -> Path:
    weights = folder / WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-16])
    return folder


def _nan_weights(folder: Path) -> Path:
    tensors = {name: torch.full_like(t, float("nan")) for name, t in load_file(folder / WEIGHTS_NAME).items()}
    save_file(tensors, folder / WEIGHTS_NAME)
    return folder


def _replace_with_folder(name: str) -> Damage:
    def damage(folder: Path) -> Path:
        (folder / name).unlink()
        (folder / name).mkdir()
        return folder
    return damage


def _remove(name: str) -> Damage:
    def damage(folder: Path) -> Path:
        (folder / name).unlink()
        return folder
    return damage


CASES: list[tuple[str, Damage, str]] = [
    ("weights-truncated", _truncate, "is not a readable safetensors file"),
    ("weights-garbage", _write(WEIGHTS_NAME, b"\x00" * 64), "is not a readable safetensors file"),
    ("weights-nan", _nan_weights, "holds NaN or infinite values"),
    ("weights-missing", _remove(WEIGHTS_NAME), "No capsule weights at"),
    ("weights-is-a-folder", _replace_with_folder(WEIGHTS_NAME), "No capsule weights at"),
    ("json-missing", _remove(METADATA_NAME), "capsule.json is missing"),
    ("json-is-a-folder", _replace_with_folder(METADATA_NAME), "capsule.json is missing"),
    ("json-garbled", _write(METADATA_NAME, b'{"format_version": 1, "layers": [0,'), "is not valid JSON"),
    ("json-not-utf8", _write(METADATA_NAME, b'{"task": "caf\xe9"}'), "is not valid JSON"),
    ("json-a-list", _write(METADATA_NAME, b"[1, 2]"), "expected a JSON object, got list"),
    ("json-missing-key", _edit_json(lambda d: d.pop("hidden_size")), "missing keys ['hidden_size']"),
    ("json-unknown-key", _edit_json(lambda d: d.update(hidden=64)), "unknown keys ['hidden']"),
    ("json-wrong-type", _edit_json(lambda d: d.update(num_layers="2")), "num_layers='2' (allowed: int)"),
    ("json-newer-format", _edit_json(lambda d: d.update(format_version=99)), "format_version=99"),
    ("json-bad-capsule-config", _edit_json(lambda d: d["config"].update(fusion="glue")), "fusion='glue'"),
    ("json-layer-out-of-range", _edit_json(lambda d: d.update(layers=[0, 7])), "layers=[0, 7] does not match"),
    ("json-negative-layer", _edit_json(lambda d: d.update(layers=[-1, 0])), "layers=[-1, 0] does not match"),
    ("json-other-base-size", _edit_json(lambda d: d.update(num_layers=4)), "num_layers: capsule has 4, model has 2"),
    ("a-file-where-a-folder-is-expected", lambda f: f / WEIGHTS_NAME, "it is a file, not a folder"),
    ("folder-does-not-exist", lambda f: f / "nowhere", "it does not exist"),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return earlier_outputs(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    """The frozen base model the finished job trained on (tiny-t5 is the same in every process)."""
    return load_model("tiny-t5", num_labels=2).model


def _check_refused(base: torch.nn.Module, target: Path, phrase: str, outputs: Path, damaged: Path) -> None:
    before = folder_digest(outputs), folder_digest(damaged)
    with pytest.raises(capt.CapsuleArtifactError) as err:
        capt.load_capsule(base, target)
    message = str(err.value)
    assert phrase in message, message
    assert "\n\n" not in message and "Traceback" not in message
    assert (folder_digest(outputs), folder_digest(damaged)) == before, "a failed load changed a file"
    capt.attach(base, capt.CapsuleConfig()).detach()  # nothing was left attached to the base model


@pytest.mark.parametrize(("name", "damage", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_a_damaged_capsule_is_refused_and_nothing_changes(name: str, damage: Damage, phrase: str,
                                                         base: torch.nn.Module, outputs: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "artifact"
    shutil.copytree(outputs / "job" / "artifact", damaged)
    _check_refused(base, damage(damaged), phrase, outputs, tmp_path)


def test_the_wrong_base_model_is_refused(outputs: Path, tmp_path: Path) -> None:
    llama = load_model("tiny-llama", num_labels=2).model
    _check_refused(llama, outputs / "job" / "artifact", "does not fit this model (model_type: capsule has 't5'",
                   outputs, tmp_path)


def test_other_weights_of_the_same_architecture_are_refused(base: torch.nn.Module, outputs: Path,
                                                           tmp_path: Path) -> None:
    other = copy.deepcopy(base)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.5)
    with pytest.raises(capt.CapsuleArtifactError, match="whose weights differ from this model's"):
        capt.load_capsule(other, outputs / "job" / "artifact")
    capt.load_capsule(other, outputs / "job" / "artifact", strict=False).detach()
