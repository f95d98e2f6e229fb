"""The other supported model types work (smoke), and unsupported combinations fail clearly."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from capt.arch import spec_for, supported_model_types
from capt.baselines import LoraConfig, PromptTuningConfig, PTuningV2Config, apply, supported_types

from .baselines_helpers import fixed_ids

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": 0}


def _make(model_type: str) -> torch.nn.Module:
    torch.manual_seed(0)
    decoders = {"mistral": (tf.MistralConfig, tf.MistralForCausalLM), "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
                "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM), "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM)}
    if model_type in decoders:
        config_cls, model_cls = decoders[model_type]
        return model_cls(config_cls(**SMALL, num_key_value_heads=2, head_dim=8)).eval()
    if model_type == "roberta":
        return tf.RobertaForSequenceClassification(tf.RobertaConfig(**{**SMALL, "pad_token_id": 1})).eval()
    return tf.MT5ForConditionalGeneration(tf.MT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                       num_heads=4, decoder_start_token_id=0, pad_token_id=0)).eval()


@pytest.mark.parametrize("config", [PTuningV2Config(num_tokens=3), PromptTuningConfig(num_tokens=3)],
                         ids=["ptuning_v2", "prompt_tuning"])
@pytest.mark.parametrize("model_type", ["mistral", "qwen3", "gemma", "roberta", "mt5"])
def test_other_model_types(model_type: str, config) -> None:
    adapted = apply(_make(model_type), config)
    ids = fixed_ids(batch=2, length=6)
    extra = {"labels": ids} if model_type == "mt5" else {}
    with torch.no_grad():
        out = adapted(input_ids=ids, attention_mask=torch.ones_like(ids), **extra)
    assert torch.isfinite(out.logits).all()
    if model_type != "roberta":
        generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=2, do_sample=False)
        assert generated.shape[0] == 2


def test_gemma2_prefix_is_refused_clearly_and_model_left_untouched() -> None:
    model = _make("gemma2")
    with pytest.raises(ValueError, match="SDPA"):
        apply(model, PTuningV2Config(num_tokens=3))
    assert all(p.requires_grad for p in model.parameters())
    apply(model, LoraConfig(r=2))  # other methods still apply


def test_supported_types_come_from_the_arch_registry() -> None:
    assert supported_types() == sorted(set(supported_model_types()) - {"umt5"})


def test_umt5_is_hosted_by_capt_but_refused_by_the_baselines() -> None:
    model = tf.UMT5ForConditionalGeneration(tf.UMT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                          num_heads=4, decoder_start_token_id=0, pad_token_id=0))
    assert spec_for(model).family == "t5"
    with pytest.raises(ValueError, match="unsupported model_type 'umt5'.*supported: bert, gemma"):
        apply(model, LoraConfig(r=2))
    assert all(p.requires_grad for p in model.parameters())
