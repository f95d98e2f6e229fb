"""`CapsuleBank`: many task capsules on one frozen base model, mixed row by row in one batch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from torch import nn

from capt.errors import CapsuleArtifactError
from capt.inject import CapsuleModel
from capt.io import CapsuleMetadata, read_capsule


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
