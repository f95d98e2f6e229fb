"""P-Tuning v2: learned key/value prefixes in every self-attention layer.

Written here rather than with PEFT's prefix tuning because, with transformers 5.x and PEFT 0.21, PEFT's
route (a cache prefix) does not reach the T5 encoder (the T5 encoder discards caches), raises on BERT
classification, and ``PeftModel.generate`` ignores the prefix (it passes ``past_key_values``; generate
uses ``cache``). The prefixes are applied by the attention route of ``capt.baselines.prefix_attention``:
T5 encoder and decoder self-attention, decoder-only self-attention, BERT encoder self-attention.
Cross-attention is untouched, as in P-Tuning v2. The prefix keys are learned directly (no rotary or
relative position applied to them) and real tokens keep positions 0..n-1 (a cache prefix would shift them by
num_tokens). P-Tuning v2 always runs on SDPA (models without SDPA support, e.g. Gemma2, are refused), so
``output_attentions`` is unavailable while it is attached.

``instance_tokens: k`` adds k training-free instance-aware tokens at inference (eval mode and ``generate``; see
``capt.baselines.instance_tokens``); training steps never see them.

Parameters per attention stack (T5 has two: encoder and decoder):
- direct: one tensor of shape (layers, 2, kv_heads, num_tokens, head_dim), i.e.
  layers x 2 x num_tokens x kv_width scalars (kv_width = d without grouped-query attention);
- reparameterised: an embedding (num_tokens, d) -> Linear(d, hidden) -> tanh -> Linear(hidden,
  layers x 2 x kv_width), evaluated per layer on that layer's slice of the output weights.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
from torch import nn

from capt.arch import AttentionSite
from capt.baselines import prefix_attention
from capt.baselines.adapted import AdaptedModel
from capt.baselines.config import PTuningV2Config
from capt.baselines.instance_tokens import attach_instance_tokens, check_instance_tokens
from capt.errors import MethodError

logger = logging.getLogger(__name__)


class StackPrefix(nn.Module):
    """Prefix keys/values for every layer of one attention stack."""

    def __init__(self, sites: list[AttentionSite], hidden_size: int, config: PTuningV2Config) -> None:
        super().__init__()
        heads = {(s.num_kv_heads, s.head_dim) for s in sites}
        if len(heads) != 1:
            raise MethodError(f"attention layers of one stack differ in (kv_heads, head_dim): {sorted(heads)}")
        (self.kv_heads, self.head_dim), = heads
        self.num_layers, self.num_tokens = len(sites), config.num_tokens
        self.dropout = nn.Dropout(config.dropout)
        self.reparameterize = config.reparameterize
        if config.reparameterize:
            self.embedding = nn.Parameter(torch.randn(config.num_tokens, hidden_size) * config.init_std)
            self.mlp_in = nn.Linear(hidden_size, config.reparam_hidden)
            self.mlp_out = nn.Linear(config.reparam_hidden, self.num_layers * 2 * self.kv_width)
        else:
            shape = (self.num_layers, 2, self.kv_heads, config.num_tokens, self.head_dim)
            self.prefix = nn.Parameter(torch.randn(shape) * config.init_std)

    @property
    def kv_width(self) -> int:
        """Width of one layer's keys (or values): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def _reparameterized(self, layer: int) -> torch.Tensor:
        hidden = torch.tanh(self.mlp_in(self.embedding))
        rows = slice(layer * 2 * self.kv_width, (layer + 1) * 2 * self.kv_width)
        flat = nn.functional.linear(hidden, self.mlp_out.weight[rows], self.mlp_out.bias[rows])
        # (tokens, 2 * kv_width) -> (2, kv_heads, tokens, head_dim)
        return flat.view(self.num_tokens, 2, self.kv_heads, self.head_dim).permute(1, 2, 0, 3)

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``layer``, each (kv_heads, num_tokens, head_dim)."""
        both = self._reparameterized(layer) if self.reparameterize else self.prefix[layer]
        both = self.dropout(both)
        return both[0], both[1]


class PTuningV2Model(AdaptedModel):
    """P-Tuning v2 wrapper: prefixes in every self-attention layer, base model frozen."""

    def __init__(self, base: nn.Module, config: PTuningV2Config) -> None:
        if not getattr(base, "_supports_sdpa", False):
            raise MethodError(
                f"P-Tuning v2 runs on SDPA attention, which {type(base).__name__} does not support "
                "(e.g. Gemma2's attention soft-capping); use another method for this model"
            )
        check_instance_tokens(base, config.instance_tokens)
        super().__init__(base, config)
        self.freeze_base()
        self.sites = self.spec.attention_sites(base)
        self.prefixes = nn.ModuleDict(
            {name: StackPrefix(sites, self.info.hidden_size, config) for name, sites in self.sites.items()}
        )
        self.prefixes.to(device=self._base_device())
        prefix_attention.ensure_registered()
        self._original_attn = base.config._attn_implementation
        base.set_attn_implementation(prefix_attention.ROUTE_NAME)
        for name, sites in self.sites.items():
            for layer, site in enumerate(sites):
                prefix_attention.attach(site.module, partial(self.prefixes[name].layer_kv, layer))
        # Kept out of the module tree (it holds the base model again); it has no parameters.
        object.__setattr__(self, "_instance", attach_instance_tokens(base, config.instance_tokens))
        logger.info("P-Tuning v2 on %s: %d prefix tokens in %s (%d trainable parameters)",
                    self.info.model_type, config.num_tokens, list(self.sites), self.num_trainable_parameters())

    def _base_device(self) -> torch.device:
        return next(self.base.parameters()).device

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """Prefix tensors (or embedding + MLP weights when reparameterised), named by stack."""
        return {f"prefixes.{name}": p for name, p in self.prefixes.named_parameters()}

    def forward(self, **kwargs):
        """The base model with the prefixes; in eval mode also with the instance tokens (when configured)."""
        if self._instance is None or self.training:
            return super().forward(**kwargs)
        return self._instance(**kwargs)

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """``base.generate`` with the prefixes and the instance tokens (when configured)."""
        if self._instance is None:
            return super().generate(input_ids, attention_mask, **kwargs)
        self._require_generate()
        return self._instance.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def _release(self) -> None:
        if self._instance is not None:
            self._instance.detach()
        for sites in self.sites.values():
            for site in sites:
                prefix_attention.release(site.module)
        self.base.set_attn_implementation(self._original_attn)
