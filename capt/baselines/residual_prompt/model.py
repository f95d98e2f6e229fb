"""Residual Prompt Tuning: the soft prompt reparameterised by a shallow MLP with a residual connection.

Razdaibiedina, Mao, Hou, Khabsa, Lewis, Ba, Almahairi, "Residual Prompt Tuning: Improving Prompt Tuning with
Residual Reparameterization", Findings of ACL 2023, arXiv 2305.03937.

Each prompt token P_i (a row of the (n, d) prompt P) is projected by one MLP shared by all tokens:

    P'_i = LayerNorm(W_up ReLU(W_down P_i + b_down) + b_up) + P_i,    W_down: d -> m,  W_up: m -> d

(the LayerNorm sits on the MLP branch, before the residual sum, as in the authors' code). P and the MLP train
jointly; the frozen model sees P' in place of P, inserted exactly as plain prompt tuning inserts its prompt
(`capt.baselines.prompt`). After training the MLP is not needed: the saved artifact holds only P' (n, d) and a
config with ``merged: true``, and loading it gives a model with that fixed prompt and no MLP.

Settings and their sources (prompt length, the bottleneck m, init, optimiser): README.md, "Baseline settings and
their sources", rows "residual_prompt". The default m = 400 is ours: it gives the 925K trainable parameters DPT
(Xiao et al. 2023) reports for this method on T5-Large with 100 tokens (100 x 1024 + 2 x 1024 x 400 + 400 + 1024 +
2 x 1024), the one published count we found; the authors' training script defaults to 800, which ``bottleneck: 800``
gives and the paper presets use. Trainable parameters: n d + 2 d m + m + d (MLP) + 2 d (LayerNorm).

Choices where the paper is silent: the MLP's Linear layers keep PyTorch's default initialisation and are
created in float32 on the embeddings' device; no dropout in the MLP (the code's default, 0).

Families: every family plain prompt tuning supports (T5 encoder input, decoder-only, BERT encoders after
[CLS]); the reparameterisation only changes how the prompt tensor is produced.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

from capt.baselines.prompt import PromptTuningModel
from capt.baselines.residual_prompt.config import ResidualPromptConfig

logger = logging.getLogger(__name__)


class ResidualMlp(nn.Module):
    """x -> LayerNorm(W_up ReLU(W_down x)) + x, applied row by row."""

    def __init__(self, width: int, bottleneck: int, device: torch.device) -> None:
        super().__init__()
        self.down = nn.Linear(width, bottleneck, device=device)
        self.up = nn.Linear(bottleneck, width, device=device)
        self.norm = nn.LayerNorm(width, device=device)

    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        """The reparameterised prompt, same shape as ``prompt``."""
        return self.norm(self.up(torch.relu(self.down(prompt)))) + prompt


class ResidualPromptModel(PromptTuningModel):
    """Prompt tuning whose prompt is LayerNorm(MLP(P)) + P while training, and the fixed P' once saved."""

    adapter_config: ResidualPromptConfig

    def _build_prompt(self, config: ResidualPromptConfig) -> None:
        super()._build_prompt(config)
        weight = self.embed.weight
        self.mlp = None if config.merged else ResidualMlp(weight.shape[1], config.bottleneck, weight.device)
        logger.info("residual prompt: %d tokens, %s", config.num_tokens,
                    "merged (no MLP)" if self.mlp is None else f"MLP bottleneck {config.bottleneck}")

    def current_prompt(self) -> torch.Tensor:
        """P' = LayerNorm(MLP(P)) + P while the MLP exists; the stored P' once merged."""
        return self.prompt if self.mlp is None else self.mlp(self.prompt)

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The prompt P and, until merged, the MLP's parameters (``mlp.down.weight``, ...)."""
        params = {"prompt": self.prompt}
        if self.mlp is not None:
            params.update({f"mlp.{name}": param for name, param in self.mlp.named_parameters()})
        return params

    def artifact_config(self) -> ResidualPromptConfig:
        """The config with ``merged: true``: the artifact holds P' and no MLP."""
        return dataclasses.replace(self.adapter_config, merged=True)

    @torch.no_grad()
    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Only what inference needs: the final prompt P' (n, d), as a float32 CPU tensor."""
        return {"prompt": self.current_prompt().detach().to("cpu", torch.float32).contiguous().clone()}
