"""Visual Fourier Prompt Tuning, carried over to text models: part of the soft prompt is Fourier-transformed.

Zeng, Zhang, Ma, Zheng, Wang, Li, Han, "Visual Fourier Prompt Tuning", NeurIPS 2024, arXiv 2411.01327.

The prompt P (n, d) splits into its first k = floor(fourier_fraction x n) tokens P_f (the authors' code truncates)
and the rest P_p; the frozen model sees

    [ Re(FFT_seq(FFT_hidden(P_f))) ; P_p ]

where FFT_hidden transforms along the hidden dimension d and FFT_seq along the k Fourier tokens (the paper's
2-D transform, ``torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).real`` in its code); only P trains, so the
trainable parameters are n x d, as in prompt tuning.

Carried over from ViT to text: the paper prompts every ViT layer (VPT-deep) and places the prompts after [CLS].
Here the prompt sits at the input embeddings only (Lester et al.'s shallow prompt tuning, the setting of the
CaPT paper's prompt baselines), inserted exactly as `capt.baselines.prompt` inserts a plain prompt: before the
T5 encoder input, before a decoder-only sequence (logits realigned), after [CLS] in BERT encoders. The Fourier
tokens come first, then the plain ones. Settings and their sources (Fourier fraction 0.5, the order, floor,
Xavier-uniform init, prompt length, optimiser): README.md, "Baseline settings and their sources", rows "vfpt".
``init: xavier`` draws P from U(-b, b), b = sqrt(6 / (fan_in + d)): the authors' code takes the fan-in of ViT's
patch embedding (3 x 16 x 16 = 768 = d of ViT-B); text has no patches, so here fan_in = d, the width of the token
embedding the prompt stands in for. ``fft_norm: backward`` (the default) is the paper's unscaled transform;
``ortho`` divides by sqrt(k d) so the Fourier tokens keep the scale of the plain ones, an option for models with
small embeddings (decoder-only models at ~0.02 per element). The transform runs in float32 (``torch.fft`` has no
bfloat16 kernel on the CPU).

Families: every family plain prompt tuning supports (T5 encoder input, decoder-only, BERT encoders).
"""

from __future__ import annotations

import logging
import math

import torch

from capt.baselines.prompt import PromptTuningModel
from capt.baselines.vfpt.config import VfptConfig

logger = logging.getLogger(__name__)


def fourier_count(config: VfptConfig) -> int:
    """k: the prompt tokens that are Fourier-transformed, floor(fraction x num_tokens) as in the authors' code."""
    return math.floor(config.fourier_fraction * config.num_tokens)


def xavier_bound(width: int) -> float:
    """b of the Xavier-uniform init U(-b, b) of a prompt of token width d: sqrt(6 / (d + d)) (module docstring)."""
    return math.sqrt(6.0 / (2 * width))


class VfptModel(PromptTuningModel):
    """Prompt tuning whose first k prompt tokens pass through a 2-D FFT (real part) before insertion."""

    adapter_config: VfptConfig

    def _build_prompt(self, config: VfptConfig) -> None:
        super()._build_prompt(config)
        self.num_fourier = fourier_count(config)
        logger.info("vfpt: %d of %d prompt tokens Fourier-transformed", self.num_fourier, config.num_tokens)

    def _initial_prompt(self, config: VfptConfig) -> torch.Tensor:
        if config.init != "xavier":
            return super()._initial_prompt(config)
        weight = self.embed.weight
        bound = xavier_bound(weight.shape[1])
        return torch.empty(config.num_tokens, weight.shape[1], device=weight.device).uniform_(-bound, bound)

    def current_prompt(self) -> torch.Tensor:
        """[Re(FFT_seq(FFT_hidden(P[:k]))) ; P[k:]], (num_tokens, d)."""
        count = self.num_fourier
        if count == 0:
            return self.prompt
        norm = self.adapter_config.fft_norm
        fourier = torch.fft.fft(torch.fft.fft(self.prompt[:count].float(), dim=-1, norm=norm), dim=-2, norm=norm)
        return torch.cat([fourier.real.to(self.prompt.dtype), self.prompt[count:]], dim=0)
