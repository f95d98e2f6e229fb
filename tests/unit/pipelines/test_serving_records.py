"""`ServedRecords`: each served capsule's record kept in columns by its bank index, read back as it was given, in
a few dozen bytes per capsule (a record object and a dict entry per capsule cost 130 or more)."""

from __future__ import annotations

import tracemalloc

import pytest

from pipelines.serving.records import ServedRecord, ServedRecords

RANK, GENERATE = object(), object()  # two collators: the records compare them by identity


def _record(index: int, task: str = "rte", collator: object = RANK, digest: str | None = None) -> ServedRecord:
    return ServedRecord(task, f"capt-minilm-{task}-{index:04d}", index + 1, digest, collator, "rank", 5)


def test_records_read_back_as_they_were_given_and_a_set_changes_only_its_own() -> None:
    given = [_record(0, digest="0f" * 32), _record(1, "cb"), _record(2, collator=GENERATE, digest="A1" * 32)]
    records = ServedRecords()
    for record in given:
        records.append(record)
    assert len(records) == 3
    assert [records.get(i) for i in range(3)] == [*given[:2], _record(2, collator=GENERATE, digest="a1" * 32)]
    assert records.get(2).collator is GENERATE and records.get(0).collator is RANK
    replaced = ServedRecord("cb", "capt-minilm-cb", 7, "ee" * 32, GENERATE, "generate", 9)
    records.set(1, replaced)
    assert [records.get(i) for i in range(3)] == [given[0], replaced, records.get(2)]
    assert records.get(2).version == 3


def test_a_bad_index_or_digest_is_refused_and_changes_nothing() -> None:
    records = ServedRecords()
    records.append(_record(0))
    with pytest.raises(IndexError, match="no capsule record at index 1 of 1"):
        records.set(1, _record(1))
    with pytest.raises(ValueError, match="not a SHA-256 hex digest"):
        records.append(_record(1, digest="ab" * 16))
    with pytest.raises(ValueError):
        records.set(0, _record(1, digest="not hex"))
    assert len(records) == 1 and records.get(0) == _record(0)


def test_a_thousand_records_cost_their_model_names_bytes_and_under_70_bytes_each() -> None:
    """A record holds its registered model's name as UTF-8 bytes in a `capt.names.NameTable` (an offset and index
    slots beside them), not as a string object; the rest is a few arrays (digest 32 bytes, version, kind)."""
    given = [_record(i, digest=f"{i:064x}") for i in range(1000)]  # built first: their names are the caller's
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        records = ServedRecords()
        for record in given:
            records.append(record)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    names = sum(len(record.model_name) for record in given)
    assert grown < 1.15 * names + 70 * 1000, f"{grown} bytes for 1,000 records and {names} bytes of names"
    assert records.get(999) == given[999]
