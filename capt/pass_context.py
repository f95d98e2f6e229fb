"""`PassContext`: what a `CapsuleModel`'s layer hooks need during one forward or generate call, worked out once per
call: the mean masks, prepared for the capsule layers, and the routing of the batch's rows to their capsules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from capt.capsule import MeanWeights
from capt.slots import match_batch


@dataclass
class PassContext:
    """What the hooks need during one forward or generate call (`capt.inject.CapsuleModel._prepare` makes it)."""

    total_len: int
    """Sequence length of the prefill, slots included; shorter hidden states are cached decode steps."""
    first_mask: torch.Tensor
    """(B, S) mean mask for the first layer of the stack: tokens only (the slot holds no state yet)."""
    rest_mask: torch.Tensor
    """(B, S) mean mask for later layers: tokens and slots."""
    row_capsule: torch.Tensor | None
    """(B,) capsule index per row, or None when every row uses capsule 0."""
    host_rows: torch.Tensor | None = None
    """`row_capsule` on the host (CPU)."""
    prepared: dict[tuple[bool, int], MeanWeights] = field(default_factory=dict)
    """The mean masks by (first layer, batch size), prepared once (`mean_weights`)."""
    routes: dict[int, Any] = field(default_factory=dict)
    """The capsules' routing of the rows by batch size (`generate` may expand the batch), worked out once."""

    def mean_weights(self, first: bool, batch: int) -> MeanWeights:
        """The first layer's (`first`) or the later layers' mean mask for a batch of `batch` rows, prepared once."""
        key = (first, batch)
        if key not in self.prepared:
            self.prepared[key] = MeanWeights.of(match_batch(self.first_mask if first else self.rest_mask, batch))
        return self.prepared[key]

    def route(self, capsules: Any, batch: int) -> Any:
        """`capsules.route` (a `capt.stack.CapsuleList` or `CapsuleStack`) of this call's rows for a batch of `batch`
        rows."""
        if batch not in self.routes:
            host = None if self.host_rows is None else match_batch(self.host_rows, batch)
            rows = None if self.row_capsule is None else match_batch(self.row_capsule, batch)
            self.routes[batch] = capsules.route(host, rows)
        return self.routes[batch]
