"""Real architecture sizes with random weights, built from `*Config` objects (no download, no checkpoint).

`shared_copy` gives each method a module tree sharing the base model's storage, so every method of a benchmark is
ready at once for interleaved timing without a weight copy per method.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

ARCHS: dict[str, dict[str, Any]] = {
    "t5-small": {"kind": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 6,
                 "num_decoder_layers": 6, "vocab_size": 32128},
    "t5-base": {"kind": "t5", "d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12, "num_layers": 12,
                "num_decoder_layers": 12, "vocab_size": 32128},
    "t5-large": {"kind": "t5", "d_model": 1024, "d_ff": 4096, "d_kv": 64, "num_heads": 16, "num_layers": 24,
                 "num_decoder_layers": 24, "vocab_size": 32128},
    "llama-3.2-1b": {"kind": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5},
    "smollm2-135m": {"kind": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5},
    "qwen2.5-1.5b": {"kind": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
}
"""Published shapes: T5 v1.0 Small/Base/Large, Llama-3.2-1B, SmolLM2-135M (the shape of `model.name=smollm2-135m`,
checked against its converted checkpoint by tests/unit/pipelines/test_smollm2.py), Qwen2.5-1.5B."""


def config_for(arch: str, **changes: Any):
    """The transformers config of `arch` (a key of ARCHS) with `changes` applied (e.g. num_hidden_layers=2)."""
    from transformers import LlamaConfig, Qwen2Config, T5Config

    fields = {**ARCHS[arch], **changes}
    kind = fields.pop("kind")
    if kind == "t5":
        return T5Config(**{"decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1, **fields})
    config_cls = LlamaConfig if kind == "llama" else Qwen2Config
    return config_cls(**{"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 4096,
                         **fields})


def model_class(config) -> type[nn.Module]:
    """The LM class for a config: T5ForConditionalGeneration or *ForCausalLM."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, T5ForConditionalGeneration

    return {"t5": T5ForConditionalGeneration, "llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}[config.model_type]


def build(config, seed: int = 0, std: float = 0.02) -> nn.Module:
    """A random-weight model in train mode: N(0, std) matrices, unit norm weights, zero biases (transformers' own
    initialisation, skipped, takes over ten seconds for a 1B-parameter vocabulary on 2 CPUs)."""
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = model_class(config)(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, std, generator=generator)
            else:
                param.fill_(0.0 if name.endswith("bias") else 1.0)
    model.tie_weights()  # skipped with the initialisation
    logger.info("built %s: %.1f M parameters", type(model).__name__, count_parameters(model) / 1e6)
    return model.train()


def build_meta(config) -> nn.Module:
    """The model on the meta device: shapes only, no memory, built in milliseconds."""
    with torch.device("meta"):
        return model_class(config)(config)


def shared_copy(model: nn.Module) -> nn.Module:
    """A new module tree of the same class whose parameters and buffers share `model`'s storage; its parameters
    are new `nn.Parameter` objects (`requires_grad` is per copy), tied weights tied again."""
    copy = build_meta(model.config)
    copy.load_state_dict(model.state_dict(), assign=True, strict=False)
    for name, buffer in model.named_buffers():  # non-persistent buffers (rotary inv_freq) are not in the state
        owner, _, leaf = name.rpartition(".")
        copy.get_submodule(owner)._buffers[leaf] = buffer
    copy.tie_weights()
    meta = [name for name, p in copy.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"shared_copy left parameters on the meta device: {meta[:5]}")
    return copy.train()


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def family(config) -> str:
    """"t5" or "decoder"."""
    return "t5" if config.model_type == "t5" else "decoder"


def describe(config) -> str:
    """One line: hidden size, layers, vocabulary."""
    if config.model_type == "t5":
        return (f"d={config.d_model}, {config.num_layers}+{config.num_decoder_layers} layers, "
                f"vocab {config.vocab_size}")
    return f"d={config.hidden_size}, {config.num_hidden_layers} layers, vocab {config.vocab_size}"


def save_random_checkpoint(arch: str, folder: Path, dtype: torch.dtype = torch.float32, **changes: Any) -> Path:
    """A random-weight `arch` (with `changes`) saved as a local checkpoint folder that jobs load by path
    (`model.name=<folder>`: any folder with a config.json loads, no pipeline hook), with the project's test
    tokenizer (its special-token ids written into the config)."""
    from capt.tasks import test_tokenizer

    tokenizer = test_tokenizer("t5" if ARCHS[arch]["kind"] == "t5" else "decoder")
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "eos", "bos")}
    model = build(config_for(arch, **ids, **changes)).to(dtype).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    logger.info("saved a random-weight %s (%s) to %s", arch, describe(model.config), folder)
    return folder
