"""SuperPos-Prompt: each soft-prompt token a learned superposition of sampled vocabulary embeddings.

Sadraei Javaheri, Asgari, McHardy, Rabiee, "SuperPos-Prompt: Enhancing Soft Prompt Tuning of Language Models
with Superposition of Multi Token Embeddings", 2024, arXiv 2406.05279.

m token ids are sampled from the vocabulary without replacement; their embeddings form E (m, d), read from the
frozen embedding matrix. Prompt token i is the superposition

    p_i = sum_j w_ij (E_j + dE_ij),   i.e. p_i = w_i (E + dE_i),   w_i: (m,),  dE_i: (m, d)

where each token has its own change dE_i of the sampled embeddings, initialised at zero (the paper's equation), so
training starts at p_i = w_i E and weight decay pulls each token's embeddings back towards the vocabulary's.
W (n, m) and dE (n, m, d) train. ``shared_embeddings: true`` trains one copy of E shared by all tokens instead
(P = W E'), ``train_embeddings: false`` keeps E frozen (P = W E). The frozen model sees P, inserted exactly as
plain prompt tuning inserts its prompt (`capt.baselines.prompt`). Trainable parameters: n m + n m d (per-token
changes), n m + m d (shared), n m (frozen).

Settings and their sources (n, m, the per-token dE, W's init, dropout, optimiser): README.md, "Baseline settings and
their sources", rows "superpos_prompt". ``base_dropout: false`` (the default) keeps the frozen base model in eval
mode while the wrapper trains (``train()`` switches only the method's own modules), which removes every dropout of
the base, including the attention dropout that T5 and Llama apply functionally from their configs. The base model's
own gradient checkpointing, which Hugging Face models run only in training mode, is off with it. The ids are drawn
with a seeded CPU generator (``sample_seed``) and stored in the artifact as an int64 tensor ``token_ids``, never
pickled.

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
        n, m, d = config.num_tokens, config.num_sampled, weight.shape[1]
        self.weights = nn.Parameter(torch.randn(n, m, device=weight.device) / math.sqrt(m))
        shared = config.train_embeddings and config.shared_embeddings
        per_token = config.train_embeddings and not config.shared_embeddings
        self.embeddings = nn.Parameter(weight.detach()[self.token_ids].clone().float()) if shared else None
        self.deltas = nn.Parameter(torch.zeros(n, m, d, device=weight.device)) if per_token else None
        logger.info("superpos prompt: %d tokens over %d sampled embeddings (changes trained: %s)", n, m,
                    "per token" if per_token else "shared" if shared else "none")

    def _sampled_embeddings(self) -> torch.Tensor:
        if self.embeddings is not None:
            return self.embeddings
        return self.embed.weight[self.token_ids].float()

    def current_prompt(self) -> torch.Tensor:
        """p_i = w_i (E + dE_i), or P = W E with shared or frozen embeddings; (num_tokens, d)."""
        sampled = self._sampled_embeddings()  # (m, d)
        if self.deltas is None:
            return self.weights @ sampled
        return torch.einsum("nm,nmd->nd", self.weights, sampled.unsqueeze(0) + self.deltas)

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The superposition weights W (n, m) and, when they train, the per-token changes dE (n, m, d) or the shared
        embeddings E (m, d)."""
        params = {"weights": self.weights}
        if self.deltas is not None:
            params["deltas"] = self.deltas
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
