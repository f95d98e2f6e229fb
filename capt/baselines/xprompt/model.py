"""XPrompt (Ma et al., "XPrompt: Exploring the Extreme of Prompt Tuning", EMNLP 2022, arXiv 2210.04457).

Three stages, all with the base model frozen and only the soft prompt P (m x d) trained:
1. Prompt tuning (Lester et al. 2021): P prepended as in `capt.baselines.prompt`.
2. Hierarchical structured pruning. Token level: a mask gamma (m,) scales the prompt, P_hat = gamma (.) P; the
   importance of token i is I_i = E_x |dL(x)/d gamma_i| at gamma = 1 (the first-order estimate of the loss change
   when the token is removed, after Michel et al. 2019), and the `token_prune_fraction` least important tokens get
   gamma_i = 0. Piece level: each surviving token is split into k = `pieces` equal pieces of width d/k with a
   mask zeta (m, k), scored the same way, I_ij = E_x |dL(x)/d zeta_ij|, and the `piece_prune_fraction` least
   important pieces of the surviving tokens get zeta_ij = 0. The prompt fed to the model is
   P_hat = P (.) gamma (.) zeta (zeta repeated d/k times along the width).
3. Rewinding (weight rewinding after Renda et al. 2020, in line with the lottery-ticket hypothesis): the surviving
   prompt is reset to its values at the end of stage 1 (the paper's Fig. 3: each stage's trained prompt initialises
   the next) and trained again under the masks.

The one training job drives the stages through `capt.phases`: `training_phases` puts the pruning at `pruning_at`
of the job's steps; `begin_phase(1, ...)` scores and prunes; the job resets the optimiser state there and, with
`restart_schedule` (the default), runs the learning-rate schedule afresh over the re-training's steps: the
re-training is a new training run in the paper.
Pruning does not change P, so "rewinding to the end of stage 1" is the prompt as it stands at the boundary.
The masks are tensors of the artifact (a loaded model has the pruned prompt) and of `phase_state` (a resumed job
keeps them); the re-training phase's best validation state is what the job keeps.

Settings and their sources (20 prompt tokens, vocabulary-sampled init, k = 16 pieces, the pruning ratios the paper
searches per task and the presets `select:` on validation, the optimiser of every stage, the schedule across the
rewind): README.md, "Baseline settings and their sources", rows "xprompt". Choices where the paper is
silent or not checked here: the expectation over x is taken per training batch (|gradient of the batch-mean loss|,
averaged over `score_batches` batches in eval mode, the same batches on every rank so all ranks prune alike); one
round of each pruning level (not iterated); a pruned token keeps its position as a zero vector (P_hat = gamma (.) P,
so the inserted length, the positions and the KV cache are unchanged); pruned entries stay in the stored tensor (the
trainable count is m x d; `surviving_parameters` counts what the masks keep).

Families: everything prompt tuning supports (T5 encoder input, decoder-only, BERT encoders after [CLS]), since
only the prompt vectors differ.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch import nn

from capt.baselines.prompt import PromptTuningModel
from capt.baselines.xprompt.config import XPromptConfig
from capt.errors import MethodError
from capt.phases import BatchLosses

logger = logging.getLogger(__name__)


class XPromptModel(PromptTuningModel):
    """A soft prompt under token and piece masks, pruned once by importance and re-trained (see the module doc)."""

    def __init__(self, base: nn.Module, config: XPromptConfig) -> None:
        width = base.get_input_embeddings().weight.shape[1]
        if width % config.pieces:
            raise MethodError(f"XPromptConfig pieces={config.pieces} does not divide the model width d={width} "
                              f"(allowed: a divisor of {width}, e.g. 16 for T5-Base's 768).")
        super().__init__(base, config)
        device = self.prompt.device
        self.token_mask = nn.Parameter(torch.ones(config.num_tokens, device=device), requires_grad=False)
        self.piece_mask = nn.Parameter(torch.ones(config.num_tokens, config.pieces, device=device),
                                       requires_grad=False)
        self._warned_no_room = False

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The soft prompt (num_tokens, d) and its masks: token (num_tokens,) and piece (num_tokens, pieces)."""
        return {"prompt": self.prompt, "token_mask": self.token_mask, "piece_mask": self.piece_mask}

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The soft prompt only (the masks are set by pruning, never by the optimiser)."""
        yield self.prompt

    def current_prompt(self) -> torch.Tensor:
        """P_hat = P (.) gamma (.) zeta: the prompt as the model sees it."""
        width = self.prompt.shape[1] // self.piece_mask.shape[1]
        pieces = self.piece_mask.repeat_interleave(width, dim=1)
        return self.prompt * self.token_mask.unsqueeze(1) * pieces

    @property
    def surviving_tokens(self) -> int:
        """Prompt tokens the token-level pruning kept."""
        return int(self.token_mask.sum().item())

    @property
    def surviving_pieces(self) -> int:
        """Pieces of the surviving tokens the piece-level pruning kept."""
        return int((self.piece_mask * self.token_mask.unsqueeze(1)).sum().item())

    @property
    def surviving_parameters(self) -> int:
        """Prompt entries the masks keep (the pruned prompt's size)."""
        return self.surviving_pieces * (self.prompt.shape[1] // self.piece_mask.shape[1])

    def training_phases(self, total_steps: int) -> list[int]:
        """One boundary: prompt tuning ends (and pruning happens) after `pruning_at` of the steps."""
        boundary = round(self.adapter_config.pruning_at * total_steps)
        if not 1 <= boundary < total_steps:
            if not self._warned_no_room:
                self._warned_no_room = True
                logger.warning("xprompt: %d steps leave no room for pruning at %.2f of them; the prompt is not pruned",
                               total_steps, self.adapter_config.pruning_at)
            return []
        return [boundary]

    def phases_restart_schedule(self) -> bool:
        """The re-training restarts the learning-rate schedule (`XPromptConfig.restart_schedule`)."""
        return self.adapter_config.restart_schedule

    def begin_phase(self, index: int, batch_losses: BatchLosses) -> None:
        """Phase 1: token-level then piece-level pruning by importance; the prompt stays as trained (rewinding)."""
        if index != 1:
            raise MethodError(f"XPrompt has phases 0 (prompt tuning) and 1 (re-training after pruning), not {index}.")
        config = self.adapter_config
        token_scores = self._importance(self.token_mask, batch_losses)
        _prune(self.token_mask, token_scores, config.token_prune_fraction)
        piece_scores = self._importance(self.piece_mask, batch_losses)
        piece_scores[self.token_mask == 0] = torch.inf  # pieces of pruned tokens are gone already
        _prune(self.piece_mask, piece_scores, config.piece_prune_fraction, among=self.surviving_tokens * config.pieces)
        logger.info("xprompt pruning: %d of %d tokens and %d of %d pieces survive (%d of %d prompt entries)",
                    self.surviving_tokens, config.num_tokens, self.surviving_pieces, config.num_tokens * config.pieces,
                    self.surviving_parameters, self.prompt.numel())

    def _importance(self, mask: nn.Parameter, batch_losses: BatchLosses) -> torch.Tensor:
        """E |dL/d mask| over `score_batches` training batches (per batch: the gradient of the batch-mean loss)."""
        total, count = torch.zeros_like(mask), 0
        mask.requires_grad_(True)
        try:
            with torch.enable_grad():
                for _, loss in zip(range(self.adapter_config.score_batches), batch_losses(), strict=False):
                    (grad,) = torch.autograd.grad(loss, mask)
                    total += grad.abs()
                    count += 1
        finally:
            mask.requires_grad_(False)
        if count == 0:
            raise MethodError("XPrompt pruning got no training batch to score the prompt with.")
        return total / count

    def phase_state(self) -> dict[str, torch.Tensor]:
        """The token and piece masks."""
        return {"token_mask": self.token_mask.detach().cpu().clone(),
                "piece_mask": self.piece_mask.detach().cpu().clone()}

    @torch.no_grad()
    def load_phase_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the masks from a checkpoint."""
        self.token_mask.copy_(state["token_mask"])
        self.piece_mask.copy_(state["piece_mask"])


@torch.no_grad()
def _prune(mask: nn.Parameter, scores: torch.Tensor, fraction: float, among: int | None = None) -> None:
    """Zero the `fraction` (of `among`, default all) of `mask` with the lowest `scores`, keeping at least one."""
    among = mask.numel() if among is None else among
    count = min(round(fraction * among), among - 1)
    if count <= 0:
        return
    lowest = torch.argsort(scores.flatten(), stable=True)[:count]
    mask.view(-1)[lowest] = 0.0
