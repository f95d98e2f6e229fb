"""Attention route that prepends learned key/value prefixes inside self-attention layers.

Why not a cache prefix (PEFT's prefix tuning): with transformers 5.x the T5 encoder discards any cache, so a
cache-borne prefix never reaches encoder self-attention, and ``PeftModel.generate`` passes the prefix as
``past_key_values`` while ``generate`` uses ``cache``, so generation silently runs without it. Instead we
register one attention function, ``ROUTE_NAME``, in BOTH ``transformers.AttentionInterface`` and
``transformers.masking_utils.AttentionMaskInterface`` (without the mask entry, models silently drop padding
masks for an unknown implementation) and switch the model to it with ``set_attn_implementation``.

For every registered self-attention module the function concatenates that layer's prefix keys/values in
front of the layer's keys/values, extends the mask with always-visible columns (and T5's relative position
bias with zero columns), then calls transformers' own SDPA attention. Other modules (cross-attention,
modules of other models) pass through unchanged. Because the prefix lives inside the attention call and
not in the sequence or the cache, positions, rotary embeddings, T5 position bias, padding masks, KV-cache
decoding, beam search and gradient checkpointing all behave exactly as for the base model.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from capt.errors import MethodError

logger = logging.getLogger(__name__)

ROUTE_NAME = "capt_prefix_sdpa"
"""Attention implementation name under which the route is registered."""

PrefixProvider = Callable[[], tuple[torch.Tensor, torch.Tensor]]
"""Returns one layer's (keys, values), each shaped (num_kv_heads, num_tokens, head_dim)."""

_PROVIDERS: weakref.WeakKeyDictionary[nn.Module, PrefixProvider] = weakref.WeakKeyDictionary()
_REGISTERED = False


def _explicit_sdpa_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """``sdpa_mask`` that never skips the mask, so causal layers always get an explicit one.

    With ``mask=None`` and more keys than queries stock SDPA would treat the layer as upper-left causal
    (and even slice the keys), which is wrong once prefix keys are prepended.
    """
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def ensure_registered() -> None:
    """Register the route in both transformers interfaces (idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        AttentionInterface.register(ROUTE_NAME, prefix_attention)
        AttentionMaskInterface.register(ROUTE_NAME, _explicit_sdpa_mask)
        _REGISTERED = True
        logger.debug("registered attention route %s", ROUTE_NAME)


def attach(module: nn.Module, provider: PrefixProvider) -> None:
    """Make ``module``'s attention use the prefix returned by ``provider``."""
    if module in _PROVIDERS:
        raise MethodError(f"{type(module).__name__} already has a prefix attached")
    _PROVIDERS[module] = provider


def release(module: nn.Module) -> None:
    """Stop prefixing ``module`` (no error if it had no prefix)."""
    _PROVIDERS.pop(module, None)


def _causal_mask(query: torch.Tensor, key_len: int, causal: bool) -> torch.Tensor:
    """Boolean (1, 1, q, k) mask; queries are the last ``q`` of ``key_len`` positions."""
    q_len = query.shape[2]
    if not causal:
        return torch.ones(1, 1, q_len, key_len, dtype=torch.bool, device=query.device)
    rows = torch.arange(q_len, device=query.device)[:, None] + (key_len - q_len)
    cols = torch.arange(key_len, device=query.device)[None, :]
    return (cols <= rows)[None, None]


def _extend_mask(mask: torch.Tensor | None, query: torch.Tensor, key_len: int, num_tokens: int,
                 causal: bool) -> torch.Tensor:
    """Prepend ``num_tokens`` always-visible key columns to an SDPA mask (bool or additive float)."""
    if mask is None:
        mask = _causal_mask(query, key_len, causal)
    shape = (*mask.shape[:-1], num_tokens)
    if mask.dtype == torch.bool:
        visible = torch.ones(shape, dtype=torch.bool, device=mask.device)
    else:
        visible = torch.zeros(shape, dtype=mask.dtype, device=mask.device)
    return torch.cat([visible, mask], dim=-1)


def _layer_prefix(provider: PrefixProvider, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The provider's prefix, cast to ``key``'s dtype/device and expanded to its batch."""
    pkey, pvalue = provider()
    batch = key.shape[0]
    pkey = pkey.to(dtype=key.dtype, device=key.device).unsqueeze(0).expand(batch, -1, -1, -1)
    pvalue = pvalue.to(dtype=key.dtype, device=key.device).unsqueeze(0).expand(batch, -1, -1, -1)
    return pkey, pvalue


def prefix_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Attention function (transformers signature) that prepends the module's prefix if it has one."""
    provider = _PROVIDERS.get(module)
    if provider is not None:
        pkey, pvalue = _layer_prefix(provider, key)
        num_tokens = pkey.shape[2]
        causal = bool(kwargs.get("is_causal") if kwargs.get("is_causal") is not None
                      else getattr(module, "is_causal", False))
        attention_mask = _extend_mask(attention_mask, query, key.shape[2], num_tokens, causal)
        bias = kwargs.get("position_bias")
        if bias is not None:
            pad = bias.new_zeros((*bias.shape[:-1], num_tokens))
            kwargs["position_bias"] = torch.cat([pad, bias], dim=-1)
        key = torch.cat([pkey, key], dim=2)
        value = torch.cat([pvalue, value], dim=2)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
