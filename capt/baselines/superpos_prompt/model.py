"""SuperPos-Prompt: each soft-prompt token a learned superposition of sampled vocabulary embeddings.

Sadraei Javaheri, Asgari, McHardy, Rabiee, "SuperPos-Prompt: Enhancing Soft Prompt Tuning of Language Models
with Superposition of Multi Token Embeddings", 2024, arXiv 2406.05279.

m token ids are sampled from the vocabulary without replacement; their embeddings form E (m, d). Prompt token i
is the superposition

    p_i = sum_j w_ij E_j,   i.e. P = W E,   W: (n, m)

W trains, and so does E (the paper updates the sampled embeddings as well; ``train_embeddings: false`` keeps
E at the frozen vocabulary's values, read from the base model's embedding matrix on every forward). The frozen
model sees P, inserted exactly as plain prompt tuning inserts its prompt (`capt.baselines.prompt`).
Trainable parameters: n m + m d (n m with ``train_embeddings: false``).

Sizes the paper reports for T5-Base: prompt length 10, m = 128 sampled embeddings (its ablation over m
plateaus at 128). The paper also finds that training converges faster and better with the frozen network's
dropout off; ``base_dropout: false`` (the default) keeps the frozen base model in eval mode while the wrapper
trains (``train()`` switches only the method's own modules), which removes every dropout of the base, including
the attention dropout that T5 and Llama apply functionally from their configs. The base model's own
gradient checkpointing, which Hugging Face models run only in training mode, is off with it.

Choices where the paper is silent or we read it so: one set of m sampled embeddings shared by all prompt tokens
(each token has its own weights); W is initialised N(0, 1/m), so that a prompt token starts with about the
variance of one embedding; the ids are drawn with a seeded CPU generator (``sample_seed``) and also stored in
the artifact as an int64 tensor ``token_ids`` (with E itself when it trains), never pickled.

Families: every family plain prompt tuning supports (T5 encoder input, decoder-only, BERT encoders).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from capt.baselines.prompt import PromptTuningModel
from capt.baselines.superpos_prompt.config import SuperPosPromptConfig
from capt.errors import MethodError

logger = logging.getLogger(__name__)


def sample_token_ids(vocab_size: int, config: SuperPosPromptConfig) -> torch.Tensor:
    """The m token ids (int64, without replacement) the seeded draw of ``config`` gives for ``vocab_size``."""
    if config.num_sampled > vocab_size:
        raise MethodError(f"superpos_prompt num_sampled={config.num_sampled} exceeds the base model's vocabulary "
                          f"of {vocab_size} embeddings; choose num_sampled <= {vocab_size}.")
    generator = torch.Generator().manual_seed(config.sample_seed)
    return torch.randperm(vocab_size, generator=generator)[: config.num_sampled]


class SuperPosPromptModel(PromptTuningModel):
    """Prompt tuning with P = W E over m sampled vocabulary embeddings E."""

    adapter_config: SuperPosPromptConfig

    def _build_prompt(self, config: SuperPosPromptConfig) -> None:
        weight = self.embed.weight
        self.register_buffer("token_ids", sample_token_ids(weight.shape[0], config).to(weight.device))
        scale = 1.0 / math.sqrt(config.num_sampled)
        self.weights = nn.Parameter(torch.randn(config.num_tokens, config.num_sampled, device=weight.device) * scale)
        sampled = weight.detach()[self.token_ids].clone().float()
        self.embeddings = nn.Parameter(sampled) if config.train_embeddings else None
        logger.info("superpos prompt: %d tokens over %d sampled embeddings (trained: %s)", config.num_tokens,
                    config.num_sampled, config.train_embeddings)

    def _sampled_embeddings(self) -> torch.Tensor:
        if self.embeddings is not None:
            return self.embeddings
        return self.embed.weight[self.token_ids].float()

    def current_prompt(self) -> torch.Tensor:
        """P = W E, (num_tokens, d)."""
        return self.weights @ self._sampled_embeddings()

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The superposition weights W (n, m) and, when they train, the sampled embeddings E (m, d)."""
        params = {"weights": self.weights}
        if self.embeddings is not None:
            params["embeddings"] = self.embeddings
        return params

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors plus the sampled ids (``token_ids``, int64)."""
        return {**super().adapter_state_dict(), "token_ids": self.token_ids.detach().to("cpu").clone()}

    @torch.no_grad()
    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load W (and E); the stored ``token_ids`` replace the seeded draw (they must be valid ids)."""
        state = dict(state)
        ids = state.pop("token_ids", None)
        if ids is None or tuple(ids.shape) != tuple(self.token_ids.shape) or ids.is_floating_point():
            raise MethodError(f"adapter tensors do not fit this model: token_ids must be {len(self.token_ids)} "
                              f"integer ids, got {None if ids is None else (tuple(ids.shape), ids.dtype)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.embed.weight.shape[0]:
            raise MethodError(f"adapter token_ids fall outside the vocabulary of {self.embed.weight.shape[0]} ids")
        super().load_adapter_state_dict(state)
        self.token_ids.copy_(ids.to(self.token_ids.device))

    def train(self, mode: bool = True) -> SuperPosPromptModel:
        """Set training mode; without ``base_dropout`` the frozen base model stays in eval mode (no dropout)."""
        super().train(mode)
        if not self.adapter_config.base_dropout:
            self.base.eval()
        return self
