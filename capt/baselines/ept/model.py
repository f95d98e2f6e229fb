"""EPT: Efficient Prompt Tuning by Multi-Space Projection and Prompt Fusion (Lan, Yang, Liu, Guo, Jiang, Zhao and
Wang, AAAI 2025, arXiv 2405.11464; no public code).

What comes from the paper (its abstract, its section structure and summaries of its method; the method section's
equations could not be read here, so the fusion and projection equations below are this module's reading):
- Prompt decomposition: the soft prompt becomes a shorter prompt P_s (l × d) plus two low-rank matrices
  A (s × r), B (r × d) whose product updates the frozen input token embeddings: DePT's decomposition, taken
  as implemented by `DeptModel` (offsets, their scaling, generation, the second learning rate).
- Prompt fusion: the low-rank matrices and the short prompt are "additional knowledge sources" that enrich the
  short prompt's semantics; the module captures the knowledge difference between the low-rank matrices and the
  short prompt, through attention.
- Multi-space projection: the prompt is projected into several subspaces whose combination weights a gating
  network learns; the reconstructed prompt replaces the original one at the input.

The equations implemented (O = (α/√r) A B, the (s × d) input-embedding offsets of DePT):

    X'_t = X_t + O_t                                        DePT's offset of input position t < s
    F = P_s + softmax(P_s Oᵀ / √d) O                       prompt fusion: the short prompt attends over O
    g = softmax(W_g · mean_rows(F)),  W_g ∈ R^{N×d}         gating network over N subspaces
    P = F + Σ_i g_i · F U_i V_i,  U_i ∈ R^{d×k}, V_i ∈ R^{k×d}   multi-space projection, reconstructed prompt

P (l × d) is inserted exactly as prompt tuning inserts its soft prompt. Trainable parameters:
l·d + s·r + r·d + N·(2·d·k) + N·d; A and B train at ``embedding_lr``, the rest at the job's learning rate.

Defaults for T5-Base: DePT's l = 60, r = 30, s = 256, α = 8 (prompt tuning's 100-token budget, which EPT compares
against) and N = 4 subspaces of rank k = 4: 76,800 + 4·2·768·4 + 4·768 = 104,448. The paper's own sizes and
learning rates could not be read here: treat N, k and the learning rates as placeholders.

Choices where the reading above leaves a detail open:
- Initialisation: DePT's (A Kaiming-uniform, B = 0); U_i Kaiming-uniform as a LoRA down-projection, V_i = 0 and
  W_g = 0, so training starts at plain prompt tuning with the short prompt (the offsets, the fusion term and
  the subspace branches all start at zero) and the subspaces start equally weighted.
- The fusion attention has no projection weights of its own (parameter-free), keeping the budget above.
- The offsets follow DePT here (`DeptModel`): every input token, generated ones included.

Families: T5 (encoder input), decoder-only and BERT encoders, exactly those of prompt tuning and DePT.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from capt.baselines.dept.model import DeptModel
from capt.baselines.ept.config import EPTConfig


def _down_projections(count: int, width: int, rank: int, device: torch.device) -> nn.Parameter:
    """(count, width, rank) LoRA-style down projections, each Kaiming-uniform over its fan-in ``width``."""
    weight = torch.empty(count, rank, width, device=device)
    for matrix in weight:
        nn.init.kaiming_uniform_(matrix, a=math.sqrt(5))
    return nn.Parameter(weight.transpose(1, 2).contiguous())


class EPTModel(DeptModel):
    """DePT's short prompt and offsets, the prompt fused with the offsets and reweighted over gated subspaces."""

    def __init__(self, base: nn.Module, config: EPTConfig) -> None:
        super().__init__(base, config)
        width, device = self.info.hidden_size, self.embed.weight.device
        self.space_down = _down_projections(config.num_spaces, width, config.space_rank, device)
        self.space_up = nn.Parameter(torch.zeros(config.num_spaces, config.space_rank, width, device=device))
        self.gate = nn.Parameter(torch.zeros(config.num_spaces, width, device=device))

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """DePT's prompt (l, d), A (s, r), B (r, d); subspace projections (N, d, k), (N, k, d); gate (N, d)."""
        return super().adapter_parameters() | {"space_down": self.space_down, "space_up": self.space_up,
                                               "gate": self.gate}

    def parameter_groups(self) -> list[tuple[list[nn.Parameter], float | None]]:
        """The prompt, subspaces and gate at the job's learning rate; A and B at ``embedding_lr`` (as DePT)."""
        (prompt, job_lr), offsets = super().parameter_groups()
        return [([*prompt, self.space_down, self.space_up, self.gate], job_lr), offsets]

    def current_prompt(self) -> torch.Tensor:
        """The reconstructed (l, d) prompt: fusion with the offsets, then the gated multi-space projection."""
        offsets = self.offsets(0, self.embedding_a.shape[0])
        short = self.prompt
        attention = torch.softmax(short @ offsets.t() / math.sqrt(short.shape[-1]), dim=-1)
        fused = short + attention @ offsets
        weights = torch.softmax(self.gate @ fused.mean(dim=0), dim=-1)
        spaces = (fused.unsqueeze(0) @ self.space_down) @ self.space_up
        return fused + torch.einsum("n,nld->ld", weights, spaces)
