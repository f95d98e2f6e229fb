"""`CapsuleBank`: many task capsules on one frozen base model, mixed row by row in one batch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from torch import nn

from capt.capsule import Capsule, read_capsule
from capt.errors import CapsuleArtifactError
from capt.inject import CapsuleModel
from capt.io import CapsuleMetadata


class CapsuleBank(CapsuleModel):
    """Capsules loaded from artifact directories, selected per row with `capsule=[name or index, ...]`.

    `bank(input_ids, attention_mask, capsule=["rte", "cb", "rte"])` runs each row with its own capsule;
    every row's output equals what that row gets with its capsule alone.
    """

    def __init__(self, base_model: nn.Module, capsules: Mapping[str, str | os.PathLike], strict: bool = True) -> None:
        if not capsules:
            raise CapsuleArtifactError("CapsuleBank needs at least one capsule directory.")
        loaded = [read_capsule(base_model, directory, strict) for directory in capsules.values()]
        super().__init__(base_model, [capsule for capsule, _ in loaded], names=list(capsules))
        self.metadata: dict[str, CapsuleMetadata] = {
            name: meta for name, (_, meta) in zip(capsules, loaded, strict=True)
        }

    @property
    def names(self) -> list[str]:
        """Capsule names, in index order."""
        return list(self.selector.names)

    def replace(self, name: str, capsule: Capsule, metadata: CapsuleMetadata) -> None:
        """Swap capsule `name` for `capsule` (from `capt.capsule.read_capsule`, so already checked against the base).

        Hot reload without rebuilding the bank: the other capsules stay as they are. The caller must not
        run the bank meanwhile (a serving replica holds its lock around forwards and this call).
        """
        if name not in self.names:
            raise CapsuleArtifactError(f"This bank holds no capsule {name!r}; it holds {self.names}.")
        index = self.names.index(name)
        if capsule.config.num_slots != self.num_slots:
            raise CapsuleArtifactError(
                f"The new capsule for {name!r} occupies {capsule.config.num_slots} slots; this bank's capsules occupy "
                f"{self.num_slots}. Capsules sharing one model must occupy the same number of slots.")
        self.capsules[index] = capsule
        self.metadata[name] = metadata
        for handle in self._handles:  # the set of capsule layers may have changed
            handle.remove()
        self._handles = self._register_hooks()
