"""`RowStack`: rows of one shape gathered into one (N, ...) tensor as they are read, one at a time."""

from __future__ import annotations

import torch

CHUNK_ROWS = 64
"""Rows per buffer while gathering: 64 MiniLM capsules are 590 KB, 64 Llama-3.2-1B capsules 8 MB."""


class RowStack:
    """Rows of one shape (and dtype, device) copied into buffers of `chunk` rows as they arrive, then given back as one
    (N, *shape) tensor (`stacked`).

    Why not keep the rows and `torch.stack` them at the end: a bank of 1,000 capsules would then hold 1,000 tensors of
    its own at once (and every module and file buffer that came with them), allocated among the load's short-lived
    objects, and the pages those pin stay resident once the rows are freed. Copied in as it arrives, each row and
    whatever read it can be freed at once, and the next capsule's reading reuses the same memory.
    """

    def __init__(self, chunk: int = CHUNK_ROWS) -> None:
        self.chunk = chunk
        self._buffers: list[torch.Tensor] = []
        self._filled = 0
        """Rows in the last buffer."""

    def __len__(self) -> int:
        return max(0, len(self._buffers) - 1) * self.chunk + self._filled

    def append(self, row: torch.Tensor) -> None:
        """Copy `row` in (its shape, dtype and device are the first row's)."""
        if not self._buffers or self._filled == self.chunk:
            self._buffers.append(row.new_empty((self.chunk, *row.shape)))
            self._filled = 0
        self._buffers[-1][self._filled].copy_(row)
        self._filled += 1

    def stacked(self) -> torch.Tensor:
        """(N, *shape): every row, in the order appended, in one tensor of its own."""
        if not self._buffers:
            raise ValueError("No row was gathered.")
        last = self._buffers[-1][:self._filled]
        return last.clone() if len(self._buffers) == 1 else torch.cat([*self._buffers[:-1], last])
