"""save_adapter / load_adapter: exact round trip, clear errors, no silent overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.io import META_NAME, WEIGHTS_NAME

from .baselines_helpers import build, random_batch, small_config

METHODS = ("prompt_tuning", "ptuning_v2", "lora", "full_finetune")


def _perturb(adapted) -> None:
    """Move every adapter tensor away from its initial value (LoRA B starts at zero)."""
    with torch.no_grad():
        for param in adapted.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_gives_identical_outputs(kind: str, method: str, tmp_path: Path) -> None:
    config = small_config(method, instance_token=True) if method == "prompt_tuning" else small_config(method)
    adapted = apply(build(kind), config)
    _perturb(adapted)
    batch = random_batch(kind)
    with torch.no_grad():
        expected = adapted(**batch).logits
    adapted.save_adapter(tmp_path / "artifact")
    meta = json.loads((tmp_path / "artifact" / META_NAME).read_text())
    assert meta["method"] == method and meta["hidden_size"] == 32 and meta["num_layers"] == 2
    loaded = load_adapter(build(kind), tmp_path / "artifact")
    assert loaded.method == method and loaded.adapter_config == adapted.adapter_config
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)


def test_reparameterized_prefix_round_trip(tmp_path: Path) -> None:
    adapted = apply(build("t5"), small_config("ptuning_v2", reparameterize=True, reparam_hidden=8))
    _perturb(adapted)
    batch = random_batch("t5")
    adapted.save_adapter(tmp_path)
    loaded = load_adapter(build("t5"), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, adapted(**batch).logits, rtol=0, atol=0)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    adapted = apply(build("llama"), small_config("ptuning_v2"))
    return adapted.save_adapter(tmp_path / "prefix")


def test_wrong_base_model_size_is_refused(saved: Path) -> None:
    with pytest.raises(AdapterError, match="hidden_size: artifact 32, model 48"):
        load_adapter(build("llama", hidden=48), saved)
    with pytest.raises(AdapterError, match="num_layers: artifact 2, model 3"):
        load_adapter(build("llama", layers=3), saved)
    with pytest.raises(AdapterError, match="model_type: artifact 'llama', model 't5'"):
        load_adapter(build("t5"), saved)


def test_wrong_base_leaves_model_unadapted(saved: Path) -> None:
    model = build("llama", hidden=48)
    with pytest.raises(AdapterError):
        load_adapter(model, saved)
    apply(model, small_config("lora"))  # no adapter was attached by the failed load


def test_corrupt_weights_give_a_clear_error(saved: Path) -> None:
    (saved / WEIGHTS_NAME).write_bytes(b"\x80\x04 not a safetensors file at all")
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        load_adapter(build("llama"), saved)


def test_truncated_weights_give_a_clear_error(saved: Path) -> None:
    data = (saved / WEIGHTS_NAME).read_bytes()
    (saved / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError):
        load_adapter(build("llama"), saved)


def test_unknown_json_keys_are_refused(saved: Path) -> None:
    meta = json.loads((saved / META_NAME).read_text())
    meta["pickle_payload"] = "x"
    (saved / META_NAME).write_text(json.dumps(meta))
    with pytest.raises(AdapterError, match="unknown keys \\['pickle_payload'\\]"):
        load_adapter(build("llama"), saved)


def test_unknown_config_keys_are_refused(saved: Path) -> None:
    meta = json.loads((saved / META_NAME).read_text())
    meta["config"]["prefix_projection"] = True
    (saved / META_NAME).write_text(json.dumps(meta))
    with pytest.raises(AdapterError, match="prefix_projection"):
        load_adapter(build("llama"), saved)


def test_corrupt_json_and_missing_files(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="no adapter metadata"):
        load_adapter(build("llama"), tmp_path / "nowhere")
    (saved / META_NAME).write_text("{not json")
    with pytest.raises(AdapterError, match="not valid JSON"):
        load_adapter(build("llama"), saved)


def test_tensor_shapes_must_match_metadata(saved: Path) -> None:
    meta = json.loads((saved / META_NAME).read_text())
    meta["config"]["num_tokens"] = 5
    (saved / META_NAME).write_text(json.dumps(meta))
    with pytest.raises(AdapterError):
        load_adapter(build("llama"), saved)


def test_existing_artifact_is_not_overwritten(saved: Path) -> None:
    before = (saved / WEIGHTS_NAME).read_bytes()
    adapted = apply(build("llama", seed=5), small_config("ptuning_v2"))
    with pytest.raises(FileExistsError):
        adapted.save_adapter(saved)
    assert (saved / WEIGHTS_NAME).read_bytes() == before
    adapted.save_adapter(saved, overwrite=True)
    assert (saved / WEIGHTS_NAME).read_bytes() != before
