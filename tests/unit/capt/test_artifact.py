"""The capsule artifact: exact round trip, and clear errors that leave the directory untouched."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
from capt.digest import MANIFEST_NAME
from capt.io import METADATA_NAME, WEIGHTS_NAME


def _trained(kind="llama", seed=0, **config):
    model = capt.attach(BUILDERS[kind](seed=seed), capt.CapsuleConfig(init="normal", **config))
    if hasattr(model.capsules[0], "projection_up"):
        with torch.no_grad():  # a trained U is non-zero; zero would hide a lost or misshapen factor
            model.capsules[0].projection_up.normal_(0.0, 0.1)
    return model


def _snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("config", [{}, {"fusion": "project", "layers": [0], "project_rank": 3},
                                    {"fusion": "conv", "length": 2},
                                    {"fusion": "prepend"}, {"task_vector": False}])
def test_round_trip_is_exact(kind, tmp_path, config):
    model = _trained(kind, **config)
    inputs = random_batch(kind)
    with torch.no_grad():
        expected = model(**inputs).logits
    capt.save_capsule(model, tmp_path, task="rte", metrics={"accuracy": 0.75})
    base = model.detach()
    loaded = capt.load_capsule(base, tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, expected)
    meta = capt.read_metadata(tmp_path)
    assert meta.task == "rte" and meta.metrics == {"accuracy": 0.75}
    assert meta.model_type == base.config.model_type and meta.hidden_size == 32 and meta.num_layers == 2
    assert capt.CapsuleConfig.from_dict(meta.config) == model.capsules[0].config
    assert meta.capt_version == capt.__version__
    assert {p.name for p in tmp_path.iterdir()} == {WEIGHTS_NAME, METADATA_NAME, MANIFEST_NAME}


def test_saving_never_overwrites_silently(tmp_path):
    model = _trained()
    capt.save_capsule(model, tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(capt.CapsuleArtifactError, match="already holds a capsule"):
        capt.save_capsule(model, tmp_path)
    assert _snapshot(tmp_path) == before
    capt.save_capsule(model, tmp_path, overwrite=True)


@pytest.fixture
def saved(tmp_path):
    model = _trained("llama")
    capt.save_capsule(model, tmp_path)
    model.detach()
    return tmp_path


def _assert_refused(directory, base, pattern, **kwargs):
    before = _snapshot(directory)
    with pytest.raises(capt.CapsuleArtifactError, match=pattern):
        capt.load_capsule(base, directory, **kwargs)
    assert _snapshot(directory) == before, "a failed load must leave the artifact untouched"


def test_wrong_architecture_or_size_is_refused(saved):
    _assert_refused(saved, BUILDERS["t5"](), r"model_type: capsule has 'llama', model has 't5'")
    _assert_refused(saved, BUILDERS["llama"](layers=3), r"num_layers: capsule has 2, model has 3")
    _assert_refused(saved, BUILDERS["qwen2"](), r"model_type")


def test_other_weights_are_refused_unless_not_strict(saved, caplog):
    other = BUILDERS["llama"](seed=7)
    _assert_refused(saved, other, "weights differ")
    capt.load_capsule(other, saved, strict=False)
    assert "strict=False" in caplog.text


def test_same_weights_in_another_dtype_are_accepted(saved):
    capt.load_capsule(BUILDERS["llama"]().to(torch.bfloat16), saved)


def test_truncated_weights_are_refused(saved):
    weights = saved / WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-40])
    _assert_refused(saved, BUILDERS["llama"](), "not a readable safetensors file")


def test_garbage_weights_are_refused(saved):
    (saved / WEIGHTS_NAME).write_bytes(b"\x80\x04not a safetensors file, maybe a pickle")
    _assert_refused(saved, BUILDERS["llama"](), "corrupt")


def test_missing_files_are_refused(saved):
    (saved / WEIGHTS_NAME).unlink()
    _assert_refused(saved, BUILDERS["llama"](), "incomplete")
    (saved / METADATA_NAME).unlink()
    _assert_refused(saved, BUILDERS["llama"](), "capsule.json is missing")


def test_metadata_problems_are_all_named(saved):
    path = saved / METADATA_NAME
    data = json.loads(path.read_text())
    data["surprise"] = 1
    data["hidden_size"] = "big"
    del data["fingerprint"]
    path.write_text(json.dumps(data))
    _assert_refused(saved, BUILDERS["llama"](),
                    r"unknown keys \['surprise'\].*missing keys \['fingerprint'\].*hidden_size='big'")


def test_invalid_json_and_config_are_refused(saved):
    path = saved / METADATA_NAME
    data = json.loads(path.read_text())
    data["config"]["fusion"] = "glue"
    path.write_text(json.dumps(data))
    _assert_refused(saved, BUILDERS["llama"](), "fusion='glue'")
    path.write_text("{not json")
    _assert_refused(saved, BUILDERS["llama"](), "not valid JSON")


def test_tensor_shapes_must_match_the_description(saved):
    path = saved / METADATA_NAME
    data = json.loads(path.read_text())
    data["config"]["length"] = 3
    path.write_text(json.dumps(data))
    _assert_refused(saved, BUILDERS["llama"](), "implies")


def test_project_rank_above_the_hidden_size_in_an_artifact_is_refused(saved):
    path = saved / METADATA_NAME
    data = json.loads(path.read_text())
    data["config"].update(fusion="project", project_rank=33)
    path.write_text(json.dumps(data))
    _assert_refused(saved, BUILDERS["llama"](), "project_rank=33 exceeds the model's hidden size 32")


ARTIFACT_MODULES = ("capt/artifact.py", "capt/io.py", "capt/baselines/io.py")
"""The modules that read, write and check artifact files and return plain data."""
ARTIFACT_IMPORTS = {"capt", "capt.arch", "capt.artifact", "capt.atomic", "capt.baselines.info", "capt.config",
                    "capt.errors", "capt.fingerprint", "capt.digest"}
"""What they may import from capt: no capsule, model class or method registry (those build from their data)."""


@pytest.mark.parametrize("module", ARTIFACT_MODULES)
def test_artifact_modules_import_no_model_class(module):
    root = Path(__file__).resolve().parents[3]
    imported = set()
    for node in ast.walk(ast.parse((root / module).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):  # `from capt import io` imports the module capt.io
            submodules = {f"{node.module}.{a.name}" for a in node.names
                          if (root / node.module.replace(".", "/") / f"{a.name}.py").is_file()}
            imported |= submodules or {node.module}
    assert {name for name in imported if name.split(".")[0] == "capt"} - ARTIFACT_IMPORTS == set()


def test_safetensors_files_are_read_whole_keeping_nothing_and_large_ones_through_load_file(tmp_path, monkeypatch):
    """`read_safetensors` gives what `load_file` gives, and 300 reads leave no Python objects behind (safetensors'
    own file reader keeps about one per call); a file over the size limit still goes through `load_file`."""
    import gc
    import tracemalloc

    from safetensors.torch import load_file, save_file

    from capt import artifact

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(3, 4), "b": torch.arange(5)}, str(path))
    expected = load_file(str(path))
    got = artifact.read_safetensors(path)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    artifact.read_safetensors(path)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(300):
            artifact.read_safetensors(path)
        gc.collect()
        left = sum(stat.count_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename")
                   if "tracemalloc" not in stat.traceback[0].filename)
    finally:
        tracemalloc.stop()
    assert left < 30, f"{left} objects left by 300 reads"
    calls = []
    monkeypatch.setattr(artifact, "SMALL_FILE_BYTES", 16)
    monkeypatch.setattr(artifact, "load_file", lambda name, device: calls.append(name) or load_file(name, device))
    assert torch.equal(artifact.read_safetensors(path)["a"], expected["a"]) and calls == [str(path)]
