"""`capt.names.NameTable`: a list of names with `list.index`'s answer for `position`, through its index's growth."""

from __future__ import annotations

import random
import sys

import pytest

from capt.names import NameTable


def test_it_behaves_as_a_list_of_names_with_the_first_of_equal_names_found():
    rng = random.Random(0)
    pool = [f"task{i}" for i in range(300)] + ["rte", "", "é-naïve", "日本語", "a" * 200, "rte ", "\ud800"]
    names = [rng.choice(pool) for _ in range(2_000)]  # repeats, and enough to grow the index many times
    table = NameTable()
    for i, name in enumerate(names):
        assert table.append(name) == i
    assert len(table) == len(names) and list(table) == names
    assert [table[i] for i in (0, 7, -1, -len(names))] == [names[0], names[7], names[-1], names[0]]
    for name in set(pool):
        assert table.position(name) == (names.index(name) if name in names else None)
        assert (name in table) == (name in names)
    assert table.position("task") is None and "rte  " not in table and 3 not in table
    with pytest.raises(IndexError):
        table[len(names)]


def test_names_given_at_construction_and_colliding_hashes_are_found():
    table = NameTable(["b", "a", "b"])
    assert list(table) == ["b", "a", "b"] and table.position("b") == 0 and table.position("a") == 1
    crowded = NameTable(str(i) for i in range(5))  # 16 slots: several names share a first slot and probe on
    assert [crowded.position(str(i)) for i in range(5)] == list(range(5)) and crowded.position("5") is None
    assert repr(table) == "NameTable(['b', 'a', 'b'])"


def test_it_holds_no_python_object_per_name():
    """1,000 capsule names cost their bytes and 12 bytes of offsets and index each (the point of the table: a
    list of strings and a dict would hold about 130 bytes of objects per name)."""
    names = [f"capt-tiny-t5-task{i:04d}" for i in range(1_000)]
    table = NameTable(names)
    held = sum(sys.getsizeof(part) for part in (table._text, table._ends, table._slots))
    text = sum(len(name) for name in names)
    assert held <= 1.15 * text + 12 * len(names) + 1_000, held
