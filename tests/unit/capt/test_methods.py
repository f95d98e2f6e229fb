"""The method registry: CaPT and every baseline implement `MethodModel` and round-trip through it alike."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
import capt.errors
from capt.baselines import AdaptedModel
from capt.methods import METHODS, MethodModel, apply_method, get_method, method_of_config

SMALL_OPTIONS = {
    "capt": {"init": "normal"},
    "prompt_tuning": {"num_tokens": 3, "instance_token": True},
    "ptuning_v2": {"num_tokens": 2},
    "lora": {"r": 2},
    "full_finetune": {},
    "adapter": {"bottleneck": 2},
    "dept": {"num_tokens": 2, "rank": 2, "max_length": 16},
    "residual_prompt": {"num_tokens": 2, "bottleneck": 4},
    "superpos_prompt": {"num_tokens": 2, "num_sampled": 8, "instance_token": True},
    "vfpt": {"num_tokens": 3},
    "smop": {"num_tokens": 2, "num_prompts": 3},
    "ept": {"num_tokens": 2, "rank": 2, "max_length": 16, "num_spaces": 2, "space_rank": 2},
    "xprompt": {"num_tokens": 4, "pieces": 4},
}


def test_every_method_is_registered_with_options_to_test():
    assert set(SMALL_OPTIONS) == set(METHODS)
    assert set(capt.baselines.METHODS) == set(METHODS) - {"capt"}
    for name, method in METHODS.items():
        assert method_of_config(method.build_config({})) == name


@pytest.mark.parametrize("name", list(SMALL_OPTIONS))
@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_each_method_saves_loads_and_detaches_through_the_protocol(name, kind, tmp_path):
    base = BUILDERS[kind]()
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    adapted = apply_method(base, get_method(name).build_config(SMALL_OPTIONS[name]))
    assert isinstance(adapted, MethodModel) and adapted.method == name and adapted.base_model is base
    with torch.no_grad():  # move every trained tensor off its initial value, so a lost one shows
        for param in adapted.trainable_parameters():
            param.add_(0.01 * torch.randn_like(param))
    batch = random_batch(kind)
    expected = adapted(**batch).logits
    adapted.save(tmp_path, task="rte", metrics={"accuracy": 50.0})
    trained = {n: p.detach().clone() for n, p in base.named_parameters()}
    assert adapted.detach() is base
    reloaded = METHODS[name].model_class.load(base, tmp_path)
    assert reloaded.method == name
    assert torch.allclose(reloaded(**batch).logits, expected, atol=1e-5)
    reloaded.detach()
    changed = name == "full_finetune"  # the one method whose parameters are the base model's
    assert all(torch.equal(trained[n] if changed else before[n], p) for n, p in base.named_parameters())


def test_sequence_overhead_is_the_positions_each_method_adds():
    overheads = {name: METHODS[name].sequence_overhead(options) for name, options in SMALL_OPTIONS.items()}
    assert overheads == {"capt": 1, "prompt_tuning": 4, "ptuning_v2": 0, "lora": 0, "full_finetune": 0,
                         "adapter": 0,
                         "dept": 2,
                         "residual_prompt": 2, "superpos_prompt": 3, "vfpt": 3,
                         "smop": 2, "ept": 2,
                         "xprompt": 4}
    assert METHODS["capt"].sequence_overhead({"fusion": "prepend", "length": 2}) == 3


def test_only_capsules_are_published_to_the_registry():
    assert {name for name, m in METHODS.items() if m.registers_model} == {"capt"}


def test_model_types_each_method_refuses_are_named():
    assert METHODS["capt"].unsupported_reason("umt5") is None
    lora_reason = METHODS["lora"].unsupported_reason("umt5")
    assert "the baselines do not support model_type='umt5' (CaPT does)" in lora_reason
    assert "model_type='gpt2'" in METHODS["capt"].unsupported_reason("gpt2")
    assert METHODS["capt"].missing_layers({"layers": [0, 3, 5]}, 4) == [5]
    assert METHODS["lora"].missing_layers({}, 1) == []


def test_unknown_names_and_configs_are_refused_clearly():
    with pytest.raises(capt.UnknownMethodError, match=r"Unknown method 'adapters' \(allowed: capt, prompt_tuning"):
        get_method("adapters")
    with pytest.raises(capt.CaptError, match="unknown method config dict"):
        apply_method(BUILDERS["t5"](), {"r": 2})


def test_a_method_loads_only_its_own_artifact(tmp_path):
    apply_method(BUILDERS["llama"](), METHODS["lora"].build_config({"r": 2})).save(tmp_path)
    base = BUILDERS["llama"]()
    with pytest.raises(capt.AdapterError, match="holds a lora adapter, not one of PromptTuningModel"):
        METHODS["prompt_tuning"].model_class.load(base, tmp_path)
    with pytest.raises(capt.CapsuleArtifactError, match="capsule.json is missing"):
        METHODS["capt"].model_class.load(base, tmp_path)
    METHODS["lora"].model_class.load(base, tmp_path).detach()  # the failed loads left nothing attached


def test_every_error_class_derives_from_capt_error():
    classes = [c for _, c in inspect.getmembers(capt.errors, inspect.isclass) if issubclass(c, BaseException)]
    assert len(classes) >= 10 and all(issubclass(c, capt.CaptError) for c in classes)
    assert issubclass(capt.AdapterError, capt.ArtifactError)
    assert issubclass(capt.CapsuleArtifactError, capt.ArtifactError)
    assert issubclass(capt.errors.AdapterExistsError, FileExistsError)


def test_adapters_get_the_same_artifact_checks_as_capsules(tmp_path):
    """NaN weights and oversized or mistyped descriptions are refused for adapters too (one validator)."""
    adapted = apply_method(BUILDERS["llama"](), METHODS["prompt_tuning"].build_config({"num_tokens": 2}))
    adapted.save(tmp_path)
    base = adapted.detach()
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "adapter.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, str(tmp_path / "adapter.safetensors"))
    with pytest.raises(capt.AdapterError, match="holds NaN or infinite values"):
        AdaptedModel.load(base, tmp_path)
    meta = json.loads((tmp_path / "adapter.json").read_text())
    (tmp_path / "adapter.json").write_text(json.dumps({**meta, "num_layers": "2"}))
    with pytest.raises(capt.AdapterError, match=r"num_layers='2' \(allowed: int\)"):
        AdaptedModel.load(base, tmp_path)
    assert Path(tmp_path / "adapter.json").stat().st_size > 0
