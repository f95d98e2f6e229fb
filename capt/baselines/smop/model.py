"""SMoP: Sparse Mixture-of-Prompts (Choi, Kim, Park, Mok and Lee, EMNLP 2023, aclanthology 2023.emnlp-main.884;
no arXiv version; code github.com/jyjohnchoi/SMoP, ``peft_models/tuners/prompt_routing.py``).

Equations, for an input with token embeddings x_1..x_n (mask m) and k soft prompts P_1..P_k of l tokens each:

    x̄ = Σ_t m_t x_t / Σ_t m_t                       mean-pooled input embedding (the router's input)
    z = W_r x̄,  W_r ∈ R^{k×d}                        linear router, no bias, orthogonal initialisation
    z̃ = z + σ · ε ⊙ z,  ε ~ N(0, I)                   router perturbation, training only (Section 2.3)
    p = softmax(z̃);  j = argmax p                    top-1 routing
    prompt(x) = p_j · P_j                            the chosen prompt, scaled by its probability so the
                                                     router gets a gradient through p_j

The prompt (l positions) is inserted exactly as prompt tuning inserts its soft prompt (`PromptTuningModel`),
but each batch row gets its own. Trainable parameters: k·l·d + k·d.

Settings and their sources (k, l, init, noise, optimiser): README.md, "Baseline settings and their sources",
rows "smop". At the default sizes (k = 4, l = 5) the count is 4·5·768 + 4·768 = 18,432 on T5-Base.

Routing (``routing``). The default, ``per_input``, is the equations above: each row gets its own chosen prompt,
which is what the paper describes and what makes a row's output independent of the other rows in its batch
(so evaluation, serving and batch size cannot change a prediction). The released code instead multiplies each
row's probability p_b by the sum over the batch of every row's chosen prompt, Σ_b' P_{j_b'}; the paper's numbers
came from that code, so ``routing: batch_broadcast`` reproduces it (a batch of one is the same in both).

Choices where the paper is silent or differs from its code:
- The noise scale σ is relative to the logits (the code's ``GaussianNoise``, whose ``sigma`` = 1 is the
  default here); evaluation uses the unperturbed router, and the prompt stays scaled by p_j there too (as in
  the code).
- No auxiliary load-balancing loss: the paper's method balances load with the perturbation alone.
- The router reads the masked mean of the input embeddings over the same positions as prompt tuning's
  instance token: for decoder-only models the prompt tokens only (an explicit ``prompt_mask``, else
  labels == -100), never the answer tokens under teacher forcing, so training, scoring and generation route a
  given prompt alike and cached generation equals uncached greedy decoding.
- The optional instance token (``instance_token``) composes as in prompt tuning: it precedes the routed prompt.

Families: T5 (encoder input), decoder-only and BERT encoders, exactly those of prompt tuning.
"""

from __future__ import annotations

import torch
from torch import nn

from capt.baselines.prompt import PromptTuningModel
from capt.baselines.smop.config import SMoPConfig
from capt.capsule import masked_mean


class SMoPModel(PromptTuningModel):
    """``num_prompts`` soft prompts of ``num_tokens`` vectors; a linear router picks one per input row."""

    def __init__(self, base: nn.Module, config: SMoPConfig) -> None:
        super().__init__(base, config)
        router = torch.empty(config.num_prompts, self.prompt.shape[-1], device=self.prompt.device)
        self.router = nn.Parameter(nn.init.orthogonal_(router))
        # The perturbation follows the mode: a model built or loaded for inference routes exactly.
        self.train(base.training)

    def _initial_prompt(self, config: SMoPConfig) -> torch.Tensor:
        """(num_prompts, num_tokens, d): each prompt initialised as prompt tuning initialises its one."""
        one_prompt = super()._initial_prompt
        return torch.stack([one_prompt(config) for _ in range(config.num_prompts)])

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The prompts, (num_prompts, num_tokens, d), and the router, (num_prompts, d)."""
        return {"prompt": self.prompt, "router": self.router}

    def routing_probabilities(self, embeds: torch.Tensor, instance_mask: torch.Tensor) -> torch.Tensor:
        """(B, num_prompts): the router's softmax over the prompts (perturbed in training)."""
        logits = masked_mean(embeds, instance_mask) @ self.router.float().t()
        noise = self.adapter_config.router_noise
        if self.training and noise > 0:
            logits = logits + noise * torch.randn_like(logits) * logits.detach()
        return logits.softmax(dim=-1)

    def row_prompts(self, embeds: torch.Tensor, instance_mask: torch.Tensor) -> torch.Tensor:
        """(B, num_tokens, d): each row's top-1 prompt scaled by its routing probability (``per_input``), or
        the sum of the batch's top-1 prompts scaled by the row's probability (``batch_broadcast``)."""
        weight, index = self.routing_probabilities(embeds, instance_mask).max(dim=-1)
        chosen = self.prompt[index]  # (B, num_tokens, d)
        if self.adapter_config.routing == "batch_broadcast":
            chosen = chosen.sum(dim=0, keepdim=True).expand_as(chosen)
        return (chosen * weight[:, None, None].to(self.prompt.dtype)).to(embeds.dtype)

    def current_prompt(self) -> torch.Tensor:
        """SMoP has no single prompt: every row gets its own (`row_prompts`)."""
        raise NotImplementedError("SMoP routes a prompt per input row; see row_prompts")
