"""`capt.rows.RowStack`: rows copied in one at a time give back exactly `torch.stack` of them, across buffer ends."""

from __future__ import annotations

import pytest
import torch

from capt.rows import RowStack


@pytest.mark.parametrize("count", [1, 3, 4, 5, 9])
def test_the_rows_come_back_stacked_in_order_across_buffer_ends(count):
    rows = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(count)]
    gathered = RowStack(buffer_bytes=4 * 2 * 3 * 4)  # 4 rows per buffer
    for row in rows[:2]:
        gathered.append(row)
    if count > 2:
        gathered.extend(torch.stack(rows[2:]))  # a block of rows across buffer ends
    assert len(gathered) == count
    stacked = gathered.stacked()
    assert torch.equal(stacked, torch.stack(rows)) and stacked.is_contiguous()
    rows[0].add_(1.0)  # copied in: the rows given are not aliased
    assert not torch.equal(stacked[0], rows[0]) and stacked.untyped_storage().nbytes() == count * 2 * 3 * 4


def test_rows_take_the_first_rows_dtype_and_an_empty_stack_is_an_error():
    gathered = RowStack()
    with pytest.raises(ValueError, match="No row"):
        gathered.stacked()
    gathered.append(torch.zeros(3, dtype=torch.float32))
    gathered.append(torch.ones(3, dtype=torch.float64))
    assert gathered.stacked().dtype == torch.float32 and gathered.stacked()[1].tolist() == [1.0] * 3
