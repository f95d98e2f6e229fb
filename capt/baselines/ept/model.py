"""EPT: Efficient Prompt Tuning by Multi-Space Projection and Prompt Fusion (Lan, Yang, Liu, Guo, Jiang, Zhao and
Wang, AAAI 2025, arXiv 2405.11464; no public code).

What comes from the paper (its abstract and section structure; the method section's equations could not be
read here, so the equations below are this module's reading of that text):
- Prompt decomposition: the soft prompt becomes a shorter prompt P_s (l × d) plus two low-rank matrices
  A (s × r), B (r × d) whose product updates the frozen input token embeddings (DePT's decomposition).
- Prompt fusion: the low-rank matrices and the short prompt are "additional knowledge sources" that enrich the
  short prompt's semantics; the module captures the knowledge difference between the low-rank matrices and the
  short prompt, through attention.
- Multi-space projection: the prompt is projected into several subspaces whose combination weights a gating
  network learns; the reconstructed prompt replaces the original one at the input.

The equations implemented (our reading; X the input embeddings, positions t < s):

    X'_t = X_t + (A B)_t                                    low-rank input update (prompt tokens only, below)
    F = P_s + softmax(P_s (A B)ᵀ / √d) (A B)               prompt fusion: the short prompt attends over A B
    g = softmax(W_g · mean_rows(F)),  W_g ∈ R^{N×d}         gating network over N subspaces
    P = F + Σ_i g_i · F U_i V_i,  U_i ∈ R^{d×k}, V_i ∈ R^{k×d}   multi-space projection, reconstructed prompt

P (l × d) is inserted exactly as prompt tuning inserts its soft prompt (`PromptTuningModel`). Trainable
parameters: l·d + s·r + r·d + N·(2·d·k) + N·d.

Defaults for T5-Base: l = 60, r = 30, s = 256 (DePT's setting at prompt tuning's 100-token budget, which EPT
compares against), N = 4 subspaces of rank k = 4: 60·768 + 256·30 + 30·768 + 4·2·768·4 + 4·768 = 104,448.
The paper's own sizes and learning rates could not be read here: treat these as placeholders.

Choices where the reading above leaves a detail open:
- Initialisation: B = 0 and V_i = 0 (the low-rank update and the subspace branches start at zero, so training
  starts at plain prompt tuning with a short prompt); A and U_i as a LoRA down-projection (Kaiming uniform);
  W_g = 0 (equal subspace weights at first).
- The fusion attention has no projection weights of its own (parameter-free), keeping the budget above.
- The low-rank update touches the positions prompt tuning's instance token averages over: for decoder-only
  models the prompt tokens only (``prompt_mask``, else labels == -100), never answer or generated tokens, so
  teacher forcing, scoring and cached generation see the same inputs (and cached generation equals uncached
  greedy decoding); for T5 and BERT every attended token. Row t of A B updates input position t as given
  (before any virtual token; BERT's [CLS] included), as in DePT.
- One learning rate for every EPT parameter (DePT trains A, B with a second, smaller one; EPT presumably too).

Families: T5 (encoder input), decoder-only and BERT encoders, exactly those of prompt tuning.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from capt.baselines.ept.config import EPTConfig
from capt.baselines.prompt import PromptTuningModel


def _down_projection(*shape: int, device: torch.device) -> nn.Parameter:
    """A LoRA-style down projection: Kaiming-uniform over its last-but-one ... last dims' fan-in."""
    weight = torch.empty(*shape, device=device)
    for matrix in weight.view(-1, *shape[-2:]):
        nn.init.kaiming_uniform_(matrix.t(), a=math.sqrt(5))
    return nn.Parameter(weight)


class EPTModel(PromptTuningModel):
    """A short soft prompt fused with a low-rank input-embedding update and reweighted over subspaces."""

    def __init__(self, base: nn.Module, config: EPTConfig) -> None:
        super().__init__(base, config)
        width, device = self.prompt.shape[-1], self.prompt.device
        self.embed_a = _down_projection(config.max_positions, config.rank, device=device)
        self.embed_b = nn.Parameter(torch.zeros(config.rank, width, device=device))
        self.space_down = _down_projection(config.num_spaces, width, config.space_rank, device=device)
        self.space_up = nn.Parameter(torch.zeros(config.num_spaces, config.space_rank, width, device=device))
        self.gate = nn.Parameter(torch.zeros(config.num_spaces, width, device=device))

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """Short prompt (l, d); A (s, r), B (r, d); subspace projections (N, d, k), (N, k, d); gate (N, d)."""
        return {"prompt": self.prompt, "embed_a": self.embed_a, "embed_b": self.embed_b,
                "space_down": self.space_down, "space_up": self.space_up, "gate": self.gate}

    def current_prompt(self) -> torch.Tensor:
        """The reconstructed (l, d) prompt: fusion with A B, then the gated multi-space projection."""
        update = self.embed_a @ self.embed_b
        short = self.prompt
        attention = torch.softmax(short @ update.t() / math.sqrt(short.shape[-1]), dim=-1)
        fused = short + attention @ update
        weights = torch.softmax(self.gate @ fused.mean(dim=0), dim=-1)
        spaces = (fused.unsqueeze(0) @ self.space_down) @ self.space_up
        return fused + torch.einsum("n,nld->ld", weights, spaces)

    def offset_input_embeds(self, embeds: torch.Tensor, instance_mask: torch.Tensor) -> torch.Tensor:
        """Input embeddings plus row t of A B at position t < s, where ``instance_mask`` is 1."""
        covered = min(embeds.shape[1], self.embed_a.shape[0])
        update = (self.embed_a[:covered] @ self.embed_b).to(embeds.dtype)
        keep = instance_mask[:, :covered, None].to(embeds.dtype)
        return torch.cat([embeds[:, :covered] + keep * update, embeds[:, covered:]], dim=1)
