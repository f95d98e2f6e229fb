"""The per-family structure the baselines read from `capt.arch`: depth, width, attention sites, LoRA targets."""

from __future__ import annotations

import json

import pytest
from tiny_models import BUILDERS
from torch import nn

from capt.arch import REGISTRY, spec_for, spec_for_model_type

EXPECTED_STACKS = {"t5": ["encoder", "decoder"], "llama": ["decoder"], "qwen2": ["decoder"], "bert": ["encoder"]}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_depth_and_width_match_the_config(kind: str) -> None:
    model = BUILDERS[kind]()
    spec = spec_for(model)
    config = model.config
    assert spec.num_layers(model) == (config.num_layers if kind == "t5" else config.num_hidden_layers)
    assert spec.hidden_size(model) == (config.d_model if kind == "t5" else config.hidden_size)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_attention_sites_are_the_self_attention_modules(kind: str) -> None:
    model = BUILDERS[kind]()
    sites = spec_for(model).attention_sites(model)
    assert list(sites) == EXPECTED_STACKS[kind]
    names = {id(module): name for name, module in model.named_modules()}
    for stack in sites.values():
        assert stack and all(id(site.module) in names for site in stack)
        assert not any("EncDecAttention" in names[id(site.module)] for site in stack)  # no cross-attention
        for site in stack:
            assert site.num_kv_heads >= 1 and site.head_dim >= 1


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_lora_targets_name_linear_modules(kind: str) -> None:
    model = BUILDERS[kind]()
    targets = spec_for(model).lora_targets
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert targets and set(targets) <= linear


def test_baseline_types_are_model_types() -> None:
    for spec in REGISTRY:
        assert spec.baseline_types is None or spec.baseline_types <= spec.model_types
        assert all(spec.accepts_baselines(t) == (spec.baseline_types is None or t in spec.baseline_types)
                   for t in spec.model_types)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_the_config_alone_gives_depth_and_position_limit(kind: str) -> None:
    # Pre-flight validation reads these from config.json without building the model (or importing torch).
    model = BUILDERS[kind]()
    fields = json.loads(model.config.to_json_string())  # what save_pretrained writes to config.json
    spec = spec_for_model_type(fields["model_type"])
    assert spec is spec_for(model)
    assert spec.layers_in_config(fields) == spec.num_layers(model)
    limit = spec.position_limit(fields)
    assert limit is None if kind == "t5" else limit == model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"it has no '{spec.layers_key}'"):
        spec.layers_in_config({"model_type": fields["model_type"]})


def test_an_unsupported_model_type_has_no_spec() -> None:
    assert spec_for_model_type("gpt2") is None
