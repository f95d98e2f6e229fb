"""`NameTable`: names by index, packed into a few flat buffers, with a hash index for `position`.

Why not a list of strings and a dict: a serving replica holds 1,000 capsules' names for as long as it runs, each a
string object of its own (about 57 bytes plus its text) and a dict entry (about 40 bytes) allocated while each
capsule loads, among that load's short-lived objects, whose pages they keep resident. A tiny T5's capsule is
512 bytes of values: those objects alone would add a fifth. Here a name costs its UTF-8 bytes, a 4-byte end offset
and 8 bytes of index (two 4-byte slots), in buffers that grow by reallocation and hold no Python object per name.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Iterator

_EMPTY = -1


def _encoded(name: str) -> bytes:
    # surrogatepass: any str is a name (a lone surrogate too), found again as it was given
    return name.encode("utf-8", "surrogatepass")


class NameTable:
    """Names in the order appended (repeats allowed); `position(name)` finds the first of equal names without a
    scan."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._text = bytearray()
        """Every name's UTF-8 bytes, one after the other."""
        self._ends = array("I")
        """Where each name's bytes end in `_text`."""
        self._slots = array("i", [_EMPTY]) * 8
        """Open addressing: the index of a name per slot, `_EMPTY` where none; at most half full."""
        for name in names:
            self.append(name)

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> str:
        if not -len(self) <= index < len(self):
            raise IndexError(f"name index {index} out of range for {len(self)} names")
        return self._bytes(index % len(self)).decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self._bytes(index).decode("utf-8", "surrogatepass") for index in range(len(self)))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.position(name) is not None

    def __repr__(self) -> str:
        return f"NameTable({list(self)})"

    def position(self, name: str) -> int | None:
        """The index of the first name equal to `name`, or None."""
        encoded = _encoded(name)
        slot = self._free_or_found(encoded)
        found = self._slots[slot]
        return None if found == _EMPTY else found

    def append(self, name: str) -> int:
        """Add `name` at the next index; that index."""
        encoded = _encoded(name)
        self._text += encoded
        self._ends.append(len(self._text))
        index = len(self) - 1
        slot = self._free_or_found(encoded)
        if self._slots[slot] == _EMPTY:  # a repeated name keeps pointing at its first index
            self._slots[slot] = index
            if 2 * len(self) > len(self._slots):
                self._rehash(2 * len(self._slots))
        return index

    def _bytes(self, index: int) -> bytearray:
        start = self._ends[index - 1] if index else 0
        return self._text[start:self._ends[index]]

    def _free_or_found(self, encoded: bytes | bytearray) -> int:
        """The slot holding `encoded`'s first index, or the empty slot where it would go (linear probing)."""
        mask = len(self._slots) - 1
        slot = zlib.crc32(encoded) & mask
        while (held := self._slots[slot]) != _EMPTY and self._bytes(held) != encoded:
            slot = (slot + 1) & mask
        return slot

    def _rehash(self, size: int) -> None:
        self._slots = array("i", [_EMPTY]) * size
        for index in range(len(self)):
            slot = self._free_or_found(self._bytes(index))
            if self._slots[slot] == _EMPTY:
                self._slots[slot] = index
