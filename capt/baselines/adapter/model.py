"""Bottleneck adapters: Houlsby, Giurgiu, Jastrzebski, Morrone, de Laroussilhe, Gesmundo, Attariyan and Gelly,
"Parameter-Efficient Transfer Learning for NLP", ICML 2019 (arXiv 1902.00751).

Equation: after a sub-layer's output projection and before its residual add, h <- h + W_up f(W_down h + b_down)
+ b_up, with W_down (m x d), W_up (d x m), m the bottleneck. W_up and b_up start at zero, so the adapted model
starts exactly at the base model; W_down is drawn from N(0, init_std) (Houlsby: near-identity initialisation with
a small std). Parameters per adapter: 2 d m + m + d.

Placement (`capt.arch` `ArchSpec.adapter_sites`): a forward hook on the output projection of each chosen sub-layer
(T5 `o` / `wo`, Llama `o_proj` / `down_proj`, BERT `attention.output.dense` / `output.dense`), so the adapter sees
the projection's output and its result goes through the model's own dropout and residual add (and, in BERT, the
post-LayerNorm), as in Houlsby's Figure 2. `detach()` removes the hooks: the base model is untouched.

Choices where the paper is silent or was BERT-only:
- T5: adapters in encoder and decoder blocks, after self-attention and feed-forward (two per block, Houlsby's
  two per layer). Cross-attention adapters are opt-in (`sublayers` with "cross_attention"): Houlsby has no
  cross-attention, and the T5-Base adapter rows quoted by later papers (Mahabadi et al. 2021, Asai et al. 2022:
  1.9M, 0.832 % of T5-Base) count two adapters per block with m = 24 (d/32) plus every layer norm:
  48 x (2 x 768 x 24 + 24 + 768) + 62 x 768 = 1,855,104.
- Layer norms train (`train_layer_norms`, default true), as in Houlsby et al., who train them with the adapters;
  their values are part of the artifact, and `detach()` writes the base model's original values back. With it
  false only the adapters train (the artifact then holds adapters only).
- Generation: adapters act per position on each new token, so decoding with the KV cache equals uncached greedy.

Families: T5 (encoder and decoder), decoder-only LMs and BERT encoders: every family whose spec names its
adapter sites.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from capt.arch import spec_for_model_type
from capt.arch.base import normalisation_modules
from capt.baselines.adapted import AdaptedModel
from capt.baselines.adapter.config import AdapterConfig
from capt.baselines.info import baseline_spec
from capt.errors import MethodError, UnsupportedModelError

logger = logging.getLogger(__name__)

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class Bottleneck(nn.Module):
    """W_up f(W_down h): the residual branch of one adapter (zero at initialisation)."""

    def __init__(self, width: int, bottleneck: int, activation: str, init_std: float) -> None:
        super().__init__()
        self.down = nn.Linear(width, bottleneck)
        self.act = ACTIVATION_MODULES[activation]()
        self.up = nn.Linear(bottleneck, width)
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(hidden)))


def _add_adapter(adapter: Bottleneck):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        weight = adapter.down.weight
        return output + adapter(output.to(weight.dtype)).to(output.dtype)

    return hook


class AdapterModel(AdaptedModel):
    """Bottleneck adapters after the chosen sub-layers of every layer; the base model frozen (but its layer norms)."""

    def __init__(self, base: nn.Module, config: AdapterConfig) -> None:
        super().__init__(base, config)
        self.freeze_base()
        paths = {id(module): name for name, module in base.named_modules()}
        sites = self.spec.adapter_sites(base)
        width = self.info.hidden_size
        self.adapters = nn.ModuleDict()
        self._handles = []
        for kind in config.sublayers:
            for module in sites.get(kind, []):
                adapter = Bottleneck(width, config.bottleneck, config.activation, config.init_std)
                adapter.to(device=module.weight.device)
                self.adapters[paths[id(module)].replace(".", "-")] = adapter
                self._handles.append(module.register_forward_hook(_add_adapter(adapter)))
        self.norms = self._trainable_norms(base) if config.train_layer_norms else {}
        self._norm_values = {name: p.detach().clone() for name, p in self.norms.items()}
        for param in self.norms.values():
            param.requires_grad_(True)
        logger.info("adapters (m=%d, %s) after %s on %s: %d adapters, %d trainable parameters", config.bottleneck,
                    config.activation, config.sublayers, self.info.model_type, len(self.adapters),
                    self.num_trainable_parameters())

    @staticmethod
    def _trainable_norms(base: nn.Module) -> dict[str, nn.Parameter]:
        return {f"{path}.{name}": param for path, module in normalisation_modules(base).items()
                for name, param in module.named_parameters(recurse=False)}

    @classmethod
    def unsupported_reason(cls, model_type: str) -> str | None:
        """The baselines' reason, or that the family's spec names no adapter sites."""
        reason = super().unsupported_reason(model_type)
        spec = spec_for_model_type(model_type)
        if reason is None and spec is not None and spec.adapter_sites is None:
            return f"adapters need the adapter sites of model_type={model_type!r}, which capt.arch does not name"
        return reason

    @classmethod
    def apply(cls, model: nn.Module, config: AdapterConfig) -> AdapterModel:
        """Wrap ``model``; a clear error when its family names no adapter sites or lacks a chosen sub-layer."""
        spec = baseline_spec(model)
        if spec.adapter_sites is None:
            raise UnsupportedModelError(cls.unsupported_reason(model.config.model_type))
        sites = spec.adapter_sites(model)
        missing = [kind for kind in config.sublayers if not sites.get(kind)]
        if missing:
            present = [kind for kind, modules in sites.items() if modules]
            raise MethodError(f"AdapterConfig sublayers={list(config.sublayers)}: this {model.config.model_type} "
                              f"model has no {', '.join(missing)} sub-layers (allowed here: {', '.join(present)}).")
        return cls(model, config)

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """Adapter weights (``adapters.<site path>.down|up.weight|bias``) and, when trained, the layer norms
        (``norms.<path in the base model>``)."""
        params = {f"adapters.{key.replace('-', '.')}.{name}": p for key, adapter in self.adapters.items()
                  for name, p in adapter.named_parameters()}
        params.update({f"norms.{name}": p for name, p in self.norms.items()})
        return params

    @torch.no_grad()
    def _release(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, param in self.norms.items():
            param.copy_(self._norm_values[name])
