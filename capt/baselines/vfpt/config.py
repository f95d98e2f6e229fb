"""`VfptConfig`: the options of Visual Fourier Prompt Tuning on text models (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capt.baselines.config import PromptTuningConfig, _is_real
from capt.errors import Problems
from capt.optim_defaults import REPARAM_OTHER, OptimDefault, Setting, measured

_VFPT_T5 = ("not tuned: VFPT (Zeng et al. 2024) has no text-model runs; the prompt-tuning T5 value (Lester et al. "
            "2021: Adafactor at lr 0.3)")

FFT_NORMS = ("backward", "ortho")
"""`torch.fft` normalisations allowed: "backward" (unscaled forward transform, the paper's) or "ortho" (unitary)."""


@dataclass(frozen=True)
class VfptConfig(PromptTuningConfig):
    """VFPT: floor(fourier_fraction x num_tokens) prompt tokens pass through Re(FFT_seq(FFT_hidden(.)))."""

    method: ClassVar[str] = "vfpt"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 0.3, _VFPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, REPARAM_OTHER),
        "encoder": OptimDefault("adamw", 1e-2, measured(1e-2, "0.003, 0.01, 0.03",
                                                        "under the authors' frozen backbone in eval mode (COPA, "
                                                        "under the earlier dropout-on setting, chose 0.003)")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompt length", ("method.options.num_tokens",),
                "ours: the paper has no text runs (ViT, VPT-deep); prompt tuning's length"),
        Setting("Fourier share, transform", ("method.options.fourier_fraction", "method.options.fft_norm"),
                "runtsang/VFPT `src/configs/config.py` (the 0.5 share; the paper sweeps 0-100 % per task) and "
                "`src/models/vit_prompt/vit_VFPT.py` (floor(share x n) Fourier tokens first, unscaled FFTs)"),
        Setting("prompt init", ("method.options.init",),
                "runtsang/VFPT (VPT's Xavier-uniform; fan_in = the 3 x 16 x 16 patch there, d on text: ours)"),
        Setting("base dropout", ("method.options.base_dropout",),
                "runtsang/VFPT `src/models/vit_prompt/vit_VFPT.py`: the frozen backbone trains in eval mode"),
    )

    inits: ClassVar[tuple[str, ...]] = ("xavier", "normal", "vocab")

    init: str = "xavier"
    """Initialisation: "xavier" (uniform in +-sqrt(6 / (2 d)), the authors' Xavier-uniform), "normal" (N(0, init_std))
    or "vocab" (copies of randomly drawn token embeddings)."""
    fourier_fraction: float = 0.5
    """Share of the prompt tokens that are Fourier-transformed (the paper's "Fourier percentage"), in [0, 1]; the
    count is floor(fourier_fraction x num_tokens), as in the authors' code."""
    fft_norm: str = "backward"
    """Normalisation of both FFTs: "backward" (unscaled, as the paper's code) or "ortho" (keeps the tokens' scale)."""
    base_dropout: bool = False
    """Keep the frozen base model's dropout during training; false keeps it in eval mode, as the authors' code does
    (runtsang/VFPT `src/models/vit_prompt/vit_VFPT.py`: the frozen backbone's `train` sets it to eval)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        check.require(_is_real(self.fourier_fraction) and 0.0 <= self.fourier_fraction <= 1.0, "fourier_fraction",
                      self.fourier_fraction, "number in [0, 1]")
        check.require(self.fft_norm in FFT_NORMS, "fft_norm", self.fft_norm, f"one of {list(FFT_NORMS)}")
        check.require(isinstance(self.base_dropout, bool), "base_dropout", self.base_dropout, "true or false")
