"""Bottleneck adapters: Houlsby, Giurgiu, Jastrzebski, Morrone, de Laroussilhe, Gesmundo, Attariyan and Gelly,
"Parameter-Efficient Transfer Learning for NLP", ICML 2019 (arXiv 1902.00751).

Equation: on a sub-layer's output h (after its output projection and, by default, its residual dropout; before the
residual add), h <- h + W_up f(W_down h + b_down) + b_up, with W_down (m x d), W_up (d x m), m the bottleneck.
Parameters per adapter: 2 d m + m + d. Settings and their sources (m, f = GELU, the placement after dropout, the
truncated-normal std 1e-3 of both projections, layer norms, optimiser): README.md, "Baseline settings and their
sources", rows "adapter". With both projections drawn at std 1e-3 the adapter starts near the identity (its branch
is O(1e-6) of h); ``up_init: zero`` makes the start exact.

Placement (`capt.arch` `ArchSpec.adapter_sites` names each sub-layer's output projection): with ``placement:
after_dropout`` (the default) a forward hook on the sub-layer's residual dropout, the module that takes the
projection's output just before the residual add (T5: the `dropout` of the `T5Layer*` holding the projection;
BERT: the `dropout` beside `attention.output.dense` / `output.dense`; Llama has no residual dropout, so the hook
stays on `o_proj` / `down_proj`); BERT's post-LayerNorm then sees h + adapter, as in Houlsby's Figure 2. With
``before_dropout`` the hook is on the projection itself and the adapter's output goes through the dropout.
`detach()` removes the hooks: the base model is untouched.

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

from capt.arch.base import normalisation_modules
from capt.baselines.adapted import AdaptedModel
from capt.baselines.adapter.config import AdapterConfig
from capt.baselines.info import baseline_spec
from capt.errors import MethodError, UnsupportedModelError

logger = logging.getLogger(__name__)

ACTIVATION_MODULES = {"gelu_tanh": lambda: nn.GELU(approximate="tanh"), "gelu": nn.GELU, "relu": nn.ReLU,
                      "tanh": nn.Tanh, "silu": nn.SiLU}
DROPOUT_LEVELS = {"t5": 2, "encoder": 1}
"""Per family, how many modules above the output projection sits the module whose `dropout` child is the sub-layer's
residual dropout (T5: T5Layer* above T5Attention / T5DenseActDense; BERT: BertSelfOutput / BertOutput); a family not
listed has no residual dropout."""


def _truncated_normal_(weight: torch.Tensor, std: float) -> None:
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)  # cut at 2 std, as TF's truncated normal


class Bottleneck(nn.Module):
    """W_up f(W_down h): the residual branch of one adapter."""

    def __init__(self, width: int, config: AdapterConfig) -> None:
        super().__init__()
        self.down = nn.Linear(width, config.bottleneck)
        self.act = ACTIVATION_MODULES[config.activation]()
        self.up = nn.Linear(config.bottleneck, width)
        _truncated_normal_(self.down.weight, config.init_std)
        if config.up_init == "zero":
            nn.init.zeros_(self.up.weight)
        else:
            _truncated_normal_(self.up.weight, config.init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(hidden)))


def hooked_module(base: nn.Module, path: str, family: str, placement: str) -> nn.Module:
    """The module whose output the adapter of the projection at `path` transforms (see the module docstring)."""
    levels = DROPOUT_LEVELS.get(family)
    if placement == "before_dropout" or levels is None:
        return base.get_submodule(path)
    return base.get_submodule(".".join(path.split(".")[:-levels] + ["dropout"]))


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
                adapter = Bottleneck(width, config).to(device=module.weight.device)
                self.adapters[paths[id(module)].replace(".", "-")] = adapter
                hooked = hooked_module(base, paths[id(module)], self.spec.family, config.placement)
                self._handles.append(hooked.register_forward_hook(_add_adapter(adapter)))
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
    def apply(cls, model: nn.Module, config: AdapterConfig) -> AdapterModel:
        """Wrap ``model``; a clear error when its family names no adapter sites or lacks a chosen sub-layer."""
        spec = baseline_spec(model)
        if spec.adapter_sites is None:
            raise UnsupportedModelError(config.unsupported_reason(model.config.model_type))
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
