"""Training phases: the hook through which a multi-stage method (XPrompt: tune, prune, rewind, re-train) is driven
by the one training loop, without the loop knowing the method.

The loop asks `training_phases(total_steps)` for the optimiser steps at which a new phase begins, and at each calls
`begin_phase(index, batch_losses)`; `phase_state()` / `load_phase_state()` carry what the phases set (masks, rewind
points) through a checkpoint. `SinglePhase` is the default of every method trained in one go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

BatchLosses = Callable[[], Iterator[torch.Tensor]]
"""Yields the training loss (with its autograd graph) of successive training batches, the same on every rank."""


class SinglePhase:
    """A method trained in one phase: no boundaries, nothing to set at one, no state beyond its parameters."""

    def training_phases(self, total_steps: int) -> list[int]:
        """Optimiser steps after which a new phase begins (increasing, within 1..total_steps-1); none."""
        return []

    def phases_restart_schedule(self) -> bool:
        """Whether each phase runs the learning-rate schedule (warm-up, decay) afresh over its own steps, as a new
        training run would; False: one schedule over the whole job."""
        return False

    def begin_phase(self, index: int, batch_losses: BatchLosses) -> None:
        """Start phase `index` (1, 2, ...); a single-phase method never gets here."""
        raise NotImplementedError(f"{type(self).__name__} trains in one phase; it has no phase {index}")

    def phase_state(self) -> dict[str, torch.Tensor]:
        """Non-trainable tensors the phases have set, for a checkpoint; none."""
        return {}

    def load_phase_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore `phase_state()` from a checkpoint; nothing to restore."""
