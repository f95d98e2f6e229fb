"""Helpers shared by the baseline tests (tiny models come from tests/tiny_models.py)."""

from __future__ import annotations

from typing import Any

import torch
from tiny_models import PAD, VOCAB, random_batch, tiny_model  # noqa: F401 (random_batch: for the baseline tests)

from capt.baselines import (
    FullFinetuneConfig,
    LoraConfig,
    PromptTuningConfig,
    PTuningV2Config,
)
from capt.baselines.adapter.config import AdapterConfig
from capt.baselines.dept.config import DeptConfig
from capt.baselines.ept.config import EPTConfig
from capt.baselines.residual_prompt.config import ResidualPromptConfig
from capt.baselines.smop.config import SMoPConfig
from capt.baselines.superpos_prompt.config import SuperPosPromptConfig
from capt.baselines.vfpt.config import VfptConfig
from capt.baselines.xprompt.config import XPromptConfig

KINDS = ("t5", "llama", "qwen2", "bert")
INIT = 0.15
"""Initialiser scale of the tiny decoder-only and BERT models: larger than the default so logits are not flat."""
T5_BRANCH_SCALE = 4.0
"""Factor on T5's residual-branch output weights, so the tiny T5 does not just repeat its input token."""
_INIT_FIELDS = {"t5": {"initializer_factor": 1.0}, "llama": {"initializer_range": INIT},
                "qwen2": {"initializer_range": INIT}, "bert": {"initializer_range": INIT}}


def _strengthen_t5_branches(model: torch.nn.Module) -> None:
    with torch.no_grad():  # stronger residual branches: a tied T5 at init otherwise echoes its input token
        for name, param in model.named_parameters():
            if name.endswith(("SelfAttention.o.weight", "EncDecAttention.o.weight", "wo.weight")):
                param.mul_(T5_BRANCH_SCALE)


GENERATIVE = ("t5", "llama")


def small_config(method: str, **overrides: Any) -> Any:
    """A small config of ``method`` suitable for tiny models."""
    if method == "prompt_tuning":
        return PromptTuningConfig(**{"num_tokens": 4, "init_std": 0.5, **overrides})
    if method == "ptuning_v2":
        return PTuningV2Config(**{"num_tokens": 3, **overrides})
    if method == "lora":
        return LoraConfig(**{"r": 2, **overrides})
    if method == "adapter":
        return AdapterConfig(**{"bottleneck": 4, **overrides})
    if method == "dept":
        return DeptConfig(**{"num_tokens": 3, "rank": 2, "max_length": 16, "init_std": 0.5, **overrides})
    if method == "residual_prompt":
        return ResidualPromptConfig(**{"num_tokens": 4, "bottleneck": 8, "init": "normal", "init_std": 0.5,
                                       **overrides})
    if method == "superpos_prompt":
        return SuperPosPromptConfig(**{"num_tokens": 4, "num_sampled": 16, **overrides})
    if method == "vfpt":
        return VfptConfig(**{"num_tokens": 4, "init_std": 0.5, **overrides})
    if method == "smop":
        return SMoPConfig(**{"num_tokens": 3, "num_prompts": 3, "init_std": 0.5, **overrides})
    if method == "ept":
        return EPTConfig(**{"num_tokens": 3, "rank": 2, "max_length": 16, "num_spaces": 2, "space_rank": 2,
                            "init_std": 0.5, **overrides})
    if method == "xprompt":
        return XPromptConfig(**{"num_tokens": 4, "pieces": 4, "init_std": 0.5, "token_prune_fraction": 0.5,
                                "piece_prune_fraction": 0.25, "score_batches": 2, **overrides})
    return FullFinetuneConfig(**overrides)


def build(kind: str, seed: int = 0, layers: int = 2, hidden: int = 32) -> torch.nn.Module:
    """A tiny model of ``kind`` in eval mode (deterministic per seed); generation never stops at EOS."""
    model = tiny_model(kind, seed, layers, hidden, **_INIT_FIELDS[kind])
    if kind == "t5":
        _strengthen_t5_branches(model)
    if hasattr(model, "generation_config"):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = PAD
    return model


def fixed_ids(batch: int = 2, length: int = 6, seed: int = 3) -> torch.Tensor:
    """Random token ids without special tokens."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=generator)


def kv_width(model: torch.nn.Module) -> int:
    """Width of one layer's keys (kv_heads x head_dim) of a tiny model."""
    config = model.config
    if config.model_type == "t5":
        return config.num_heads * config.d_kv
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads * (config.hidden_size // config.num_attention_heads)


def attention_layers(model: torch.nn.Module) -> int:
    """Self-attention layers with a prefix: T5 encoder + decoder, else the one stack."""
    config = model.config
    if config.model_type == "t5":
        return config.num_layers + config.num_decoder_layers
    return config.num_hidden_layers


def greedy_without_cache(adapted: Any, kind: str, ids: torch.Tensor, steps: int, **extra: Any) -> torch.Tensor:
    """Greedy decoding by re-running the wrapper's forward on the whole sequence each step (no cache)."""
    with torch.no_grad():
        if kind == "t5":
            seq = torch.full((ids.shape[0], 1), adapted.base.config.decoder_start_token_id)
            for _ in range(steps):
                logits = adapted(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=seq,
                                 use_cache=False).logits
                seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return seq
        seq = ids
        for _ in range(steps):
            mask = torch.ones_like(seq)
            prompt_mask = torch.zeros_like(seq)
            prompt_mask[:, : ids.shape[1]] = 1
            kwargs = {"prompt_mask": prompt_mask} if extra.get("pass_prompt_mask") else {}
            logits = adapted(input_ids=seq, attention_mask=mask, use_cache=False, **kwargs).logits
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return seq


def perturb(adapted: Any, scale: float = 0.1) -> None:
    """Move every trainable tensor (zero-initialised ones included) away from its initial value."""
    with torch.no_grad():
        for param in adapted.trainable_parameters():
            param.add_(torch.randn_like(param) * scale)


def logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's logits on `batch`, without a graph."""
    with torch.no_grad():
        return model(**batch).logits
