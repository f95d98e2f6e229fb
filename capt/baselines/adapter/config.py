"""`AdapterConfig`: the options of bottleneck adapters (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from capt.arch import spec_for_model_type
from capt.baselines.config import BaselineConfig, _is_int, _is_real
from capt.errors import Problems
from capt.optim_defaults import UNMEASURED, OptimDefault, Setting, measured

_ADAPTER = "Houlsby et al. 2019 (adapters on BERT GLUE): Adam, lr swept over {3e-5, 3e-4, 3e-3}; 3e-4, the middle"
_ADAPTER_OTHER = _ADAPTER + "; " + UNMEASURED

ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "tanh", "silu")
"""Non-linearities the bottleneck may use (gelu_tanh: GELU's tanh approximation, BERT's and Houlsby's code's)."""
PLACEMENTS = ("after_dropout", "before_dropout")
"""Where an adapter reads its sub-layer's output: after the sub-layer's residual dropout (Houlsby's code) or before."""
UP_INITS = ("truncated_normal", "zero")
"""Initialisations of the up projection: like the down projection (Houlsby's code) or zero (an exact identity start)."""
SUBLAYERS = ("attention", "cross_attention", "feed_forward")
"""Sub-layers an adapter may follow (cross_attention: T5's decoder only)."""


@dataclass(frozen=True)
class AdapterConfig(BaselineConfig):
    """Houlsby bottleneck adapters h + W_up f(W_down h) after the chosen sub-layers of every layer."""

    method: ClassVar[str] = "adapter"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 3e-4, _ADAPTER_OTHER),
        "decoder": OptimDefault("adamw", 3e-4, _ADAPTER_OTHER),
        "encoder": OptimDefault("adamw", 3e-5, measured(3e-5, "3e-5, 3e-4, 3e-3", "with issue 33's adapter, by 0.003 "
                                                        "points of mean validation over 3e-3 (a tie on 26 rows; test "
                                                        "61.19 against 61.22). " + _ADAPTER)),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("optimiser, lr", ("optim.name", "optim.lr"),
                "AdamW: google-research/adapter-bert `optimization.py`; lr 3e-4 on T5 and decoders: the authors' "
                "README example (`run_classifier.py --learning_rate=3e-4`), the middle of Houlsby et al. 2019's "
                "sweep {3e-5, 3e-4, 3e-3}; encoders: measured (`capt/baselines/adapter/config.py`)"),
        Setting("bottleneck m", ("method.options.bottleneck",),
                "ours: the T5-Base adapter rows of Mahabadi et al. 2021 / Asai et al. 2022 that T5 comparisons quote "
                "(1.9M on T5-Base); Houlsby et al. 2019 sweep {8, 64, 256}, their code defaults to 64"),
        Setting("activation", ("method.options.activation",),
                "google-research/adapter-bert `modeling.py` (`feedforward_adapter`, BERT's `gelu`)"),
        Setting("placement", ("method.options.placement",),
                "after the sub-layer's residual dropout, before the residual add: google-research/adapter-bert "
                "`modeling.py` (`transformer_model`); Houlsby et al. 2019, Fig. 2"),
        Setting("init", ("method.options.init_std", "method.options.up_init"),
                "google-research/adapter-bert `modeling.py` (`init_scale=1e-3`, truncated normal; biases zero)"),
        Setting("sub-layers, layer norms", ("method.options.sublayers", "method.options.train_layer_norms"),
                "Houlsby et al. 2019, Section 2.1 and Fig. 2; T5 cross-attention adapters are opt-in (ours)"),
        Setting("weight decay, warm-up", ("optim.weight_decay", "optim.warmup_ratio"),
                "google-research/adapter-bert `optimization.py` (AdamW, weight decay 0.01) and `run_classifier.py` "
                "(warm-up over 10 % of the steps, then linear decay)"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {"optim.weight_decay": 0.01, "optim.warmup_ratio": 0.1}

    bottleneck: int = 24
    """Width m of the bottleneck (24 = d/32 on T5-Base, the size behind the 1.9M adapter rows of T5 papers)."""
    activation: str = "gelu_tanh"
    """Non-linearity f between the down and up projections (gelu_tanh, gelu, relu, tanh or silu)."""
    placement: str = "after_dropout"
    """"after_dropout": the adapter transforms the sub-layer's output after its residual dropout, as in Houlsby's code;
    "before_dropout": the output projection's result, before that dropout."""
    sublayers: list[str] = field(default_factory=lambda: ["attention", "feed_forward"])
    """Sub-layers followed by an adapter: attention (self-attention), cross_attention (T5 decoder), feed_forward."""
    train_layer_norms: bool = True
    """Train every layer norm of the base model as well (Houlsby et al. do); detach() restores their values."""
    init_std: float = 1e-3
    """Standard deviation of the projections' truncated-normal initialisation (cut at +-2 std; biases start at zero)."""
    up_init: str = "truncated_normal"
    """The up projection's initialisation: "truncated_normal" (as the down one: a near-identity start) or "zero"."""

    def _validate(self, check: Problems) -> None:
        check.require(_is_int(self.bottleneck) and self.bottleneck >= 1, "bottleneck", self.bottleneck,
                      "integer >= 1")
        check.require(self.activation in ACTIVATIONS, "activation", self.activation, f"one of {list(ACTIVATIONS)}")
        check.require(self.placement in PLACEMENTS, "placement", self.placement, f"one of {list(PLACEMENTS)}")
        check.require(self.up_init in UP_INITS, "up_init", self.up_init, f"one of {list(UP_INITS)}")
        chosen = self.sublayers
        ok = (isinstance(chosen, list | tuple) and len(chosen) > 0
              and all(isinstance(s, str) and s in SUBLAYERS for s in chosen) and len(set(chosen)) == len(chosen))
        check.require(ok, "sublayers", chosen, f"a non-empty list without repeats of {list(SUBLAYERS)}")
        check.require(isinstance(self.train_layer_norms, bool), "train_layer_norms", self.train_layer_norms,
                      "true or false")
        check.require(_is_real(self.init_std) and self.init_std > 0, "init_std", self.init_std,
                      "finite number > 0")

    @classmethod
    def unsupported_reason(cls, model_type: str) -> str | None:
        """The baselines' reason, or that the family's spec names no adapter sites."""
        reason = super().unsupported_reason(model_type)
        spec = spec_for_model_type(model_type)
        if reason is None and spec is not None and spec.adapter_sites is None:
            return f"adapters need the adapter sites of model_type={model_type!r}, which capt.arch does not name"
        return reason
