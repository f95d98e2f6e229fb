"""The digest manifest of capsule and adapter artifacts (`capt.digest`): sealed on save, verified on load.

A tampered weight file, a tampered JSON field, tensors re-saved as float16, an added or missing file and an
edited manifest are refused naming the file, the expected and the found digest; an untouched artifact loads
byte-identically; one without a manifest (written before) loads with a one-line warning; saving the same
tensors twice gives the same bytes (safetensors header metadata in canonical order).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import BUILDERS, random_batch

import capt
from capt import digest
from capt.baselines import load_adapter
from capt.baselines.adapter.config import AdapterConfig
from capt.errors import AdapterIntegrityError, ArtifactIntegrityError, CapsuleIntegrityError
from capt.methods import apply_method


def _capsule(tmp_path: Path, name: str = "capsule", seed: int = 0) -> tuple[torch.nn.Module, Path]:
    model = capt.attach(BUILDERS["t5"](seed=0), capt.CapsuleConfig(init="normal"))
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.trainable_parameters():
            param.normal_()
    folder = tmp_path / name
    capt.save_capsule(model, folder, task="rte")
    return model, folder


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(error: type[Exception], load, folder: Path, file: str, expected: str, found: str) -> str:
    with pytest.raises(error) as raised:
        load(folder)
    message = str(raised.value)
    assert all(text in message for text in (str(folder), file, expected, found)), message
    assert "\n" not in message and "no option loads" in message
    return message


def test_an_untouched_capsule_verifies_and_loads_byte_identically(tmp_path: Path) -> None:
    model, folder = _capsule(tmp_path)
    inputs = random_batch("t5")
    with torch.no_grad():
        expected = model(**inputs).logits
    manifest = json.loads((folder / digest.MANIFEST_NAME).read_text())
    assert manifest["files"] == {n: _sha(folder / n) for n in ("capsule.json", "capsule.safetensors")}
    assert digest.verify(folder) == manifest["digest"] == digest.artifact_digest(manifest["files"])
    loaded = capt.load_capsule(model.detach(), folder)
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, expected)


@pytest.mark.parametrize("name", ["weights-times-minus-100", "weights-float16"])
def test_tampered_or_float16_weights_are_refused(tmp_path: Path, name: str) -> None:
    model, folder = _capsule(tmp_path)
    base = model.detach()
    weights = folder / "capsule.safetensors"
    recorded = _sha(weights)
    tensors = load_file(weights)
    changed = ({k: t * -100 for k, t in tensors.items()} if name == "weights-times-minus-100"
               else {k: t.half() for k, t in tensors.items()})  # a dtype change: the same values, other bytes
    save_file(changed, weights, metadata={"format": "pt"})
    _refused(CapsuleIntegrityError, lambda f: capt.load_capsule(base, f), folder, "capsule.safetensors", recorded,
             _sha(weights))


@pytest.mark.parametrize("change", [{"task": "cb"}, {"config": "instance_mean"}])
def test_a_tampered_json_field_is_refused(tmp_path: Path, change: dict) -> None:
    model, folder = _capsule(tmp_path)
    base = model.detach()
    path = folder / "capsule.json"
    recorded, data = _sha(path), json.loads(path.read_text())
    if "config" in change:
        data["config"]["instance_mean"] = False  # a behaviour change that passes every structural check
    else:
        data.update(change)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    message = _refused(capt.CapsuleArtifactError, lambda f: capt.load_capsule(base, f, strict=False), folder,
                       "capsule.json", recorded, _sha(path))
    assert "failed its integrity check" in message


def test_an_added_file_a_missing_file_and_an_edited_manifest_are_refused(tmp_path: Path) -> None:
    _, folder = _capsule(tmp_path)
    extra = folder / "head.safetensors"
    save_file({"w": torch.ones(2)}, extra)
    _refused(ArtifactIntegrityError, digest.verify, folder, "head.safetensors", "not listed", _sha(extra))
    extra.unlink()
    manifest = json.loads((folder / digest.MANIFEST_NAME).read_text())
    manifest["files"]["capsule.json"] = "0" * 64  # a forged entry no longer adds up to the recorded digest
    (folder / digest.MANIFEST_NAME).write_text(json.dumps(manifest))
    _refused(ArtifactIntegrityError, digest.verify, folder, "capsule.json", "0" * 64, _sha(folder / "capsule.json"))
    resealed = digest.seal(folder)
    with pytest.raises(ArtifactIntegrityError, match="as a whole"):  # re-sealed: no longer what was recorded
        digest.verify(folder, expected="f" * 64)
    assert digest.verify(folder, expected=resealed) == resealed
    (folder / "capsule.json").unlink()
    _refused(ArtifactIntegrityError, digest.verify, folder, "capsule.json", json.loads(
        (folder / digest.MANIFEST_NAME).read_text())["files"]["capsule.json"], "missing")


def test_a_capsule_without_a_manifest_loads_with_a_one_line_warning(tmp_path: Path, caplog) -> None:
    model, folder = _capsule(tmp_path)
    (folder / digest.MANIFEST_NAME).unlink()
    with caplog.at_level(logging.WARNING, logger="capt.digest"):
        capt.load_capsule(model.detach(), folder).detach()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "capt.digest"]
    assert "cannot be verified" in warning and "\n" not in warning
    with pytest.raises(ArtifactIntegrityError, match="digest.json.*missing"):  # unless a digest was recorded
        digest.verify(folder, expected="a" * 64)


def test_saving_the_same_capsule_or_adapter_twice_gives_identical_bytes(tmp_path: Path) -> None:
    _, first = _capsule(tmp_path, "one")
    _, second = _capsule(tmp_path, "two")
    assert {p.name: _sha(p) for p in first.iterdir()} == {p.name: _sha(p) for p in second.iterdir()}
    adapted = apply_method(BUILDERS["t5"](seed=0), AdapterConfig())
    adapted.save_adapter(tmp_path / "a1")
    adapted.save_adapter(tmp_path / "a2")
    assert {p.name: _sha(p) for p in (tmp_path / "a1").iterdir()} == {p.name: _sha(p)
                                                                        for p in (tmp_path / "a2").iterdir()}
    header = (tmp_path / "a1" / "adapter.safetensors").read_bytes()[8:200]
    assert header.index(b'"format"') < header.index(b'"method"')  # sorted, whatever the HashMap's order


def test_a_tampered_adapter_is_refused_and_an_untouched_one_loads(tmp_path: Path) -> None:
    adapted = apply_method(BUILDERS["t5"](seed=0), AdapterConfig())
    adapted.save_adapter(tmp_path / "adapter")
    base = adapted.detach()
    load_adapter(base, tmp_path / "adapter").detach()
    shutil.copytree(tmp_path / "adapter", tmp_path / "tampered")
    weights = tmp_path / "tampered" / "adapter.safetensors"
    recorded = _sha(weights)
    save_file({k: t + 1 for k, t in load_file(weights).items()}, weights, metadata={"format": "capt-baseline-adapter"})
    _refused(AdapterIntegrityError, lambda f: load_adapter(base, f), tmp_path / "tampered", "adapter.safetensors",
             recorded, _sha(weights))


@pytest.mark.parametrize("kind", ["same-bytes-elsewhere", "system-file", "dangling", "folder"])
def test_a_symbolic_link_in_an_artifact_is_refused_by_name_and_target(tmp_path: Path, kind: str) -> None:
    """Even a link to a copy with the very bytes the manifest records is refused: the folder is not plain files."""
    model, folder = _capsule(tmp_path)
    linked = folder / ("extra" if kind == "folder" else "capsule.json")
    target = {"same-bytes-elsewhere": tmp_path / "copy.json", "system-file": Path("/etc/passwd"),
              "dangling": tmp_path / "gone.json", "folder": tmp_path}[kind]
    if kind == "same-bytes-elsewhere":
        shutil.copyfile(linked, target)
    if linked.exists():
        linked.unlink()
    linked.symlink_to(target)
    for load in (digest.verify, lambda f: capt.load_capsule(model.detach(), f), digest.seal):
        with pytest.raises(ArtifactIntegrityError) as raised:
            load(folder)
        message = str(raised.value)
        assert f"{linked.name} -> {str(target)!r}" in message and "symbolic link" in message, message
        assert str(folder) in message and "\n" not in message
