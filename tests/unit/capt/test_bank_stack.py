"""A bank's capsules and heads stored once (`capt.stack.CapsuleStack`, `capt.heads.TaskHeads`): many distinct
capsules of one configuration fuse in one gather and each row still equals its capsule alone; what a capsule costs
the bank beyond its values stays within a measured bound."""

from __future__ import annotations

import functools
import gc
import tracemalloc
import weakref

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
import capt.heads
from capt.capsule import read_capsule
from capt.heads import TaskHead, TaskHeads

FUSIONS = {"add": {}, "project": {"fusion": "project"}, "conv": {"fusion": "conv"}, "prepend": {"fusion": "prepend"}}


def _saved(kind: str, config: capt.CapsuleConfig, seed: int, folder):
    model = capt.attach(BUILDERS[kind](), config)
    torch.manual_seed(seed)  # after the builder, which seeds its own weights
    with torch.no_grad():  # every parameter random, so that a capsule mixed up with another shows
        for parameter in model.capsules[0].parameters():
            parameter.normal_(0.0, 0.3)
    path = capt.save_capsule(model, folder)
    model.detach()
    return path


@pytest.mark.parametrize("kind", ["t5", "bert"])
@pytest.mark.parametrize("fusion", list(FUSIONS))
def test_distinct_capsules_of_one_config_gather_in_one_group_and_each_row_equals_its_capsule_alone(
        kind, fusion, tmp_path):
    config = capt.CapsuleConfig(**FUSIONS[fusion])
    dirs = {f"c{i}": _saved(kind, config, 200 + i, tmp_path / f"c{i}") for i in range(4)}
    base = BUILDERS[kind]()
    inputs = random_batch(kind, batch=6)
    choice = ["c2", "c0", "c3", "c2", "c1", "c0"]
    bank = capt.CapsuleBank(base, dirs)
    assert len(bank.capsules.groups) == 1 and len(bank.capsules) == 4
    with torch.no_grad():
        mixed = bank(**inputs, capsule=choice).logits
    bank.detach()
    for name, directory in dirs.items():  # the same batch through each capsule alone: the rows that chose it
        single = capt.load_capsule(base, directory)
        with torch.no_grad():
            alone = single(**inputs).logits
        single.detach()
        rows = [row for row, chosen in enumerate(choice) if chosen == name]
        # "project": a batched matmul per row against one matmul, summed in another order (a wrong row: O(1))
        tolerance = 1e-3 if fusion == "project" else 1e-6
        torch.testing.assert_close(mixed[rows], alone[rows], atol=tolerance, rtol=tolerance)


def test_a_capsule_of_another_config_replacing_one_moves_to_its_group_and_back(tmp_path):
    plain, odd = capt.CapsuleConfig(init="normal"), capt.CapsuleConfig(init="normal", layers="odd")
    dirs = {name: _saved("t5", config, seed, tmp_path / name)
            for seed, (name, config) in enumerate({"a": plain, "b": plain, "odd": odd}.items())}
    base = BUILDERS["t5"]()
    bank = capt.CapsuleBank(base, {"a": dirs["a"], "b": dirs["b"]})
    bank.replace("a", read_capsule(base, dirs["odd"])[0])
    assert len(bank.capsules.groups) == 2 and bank.capsules[0].layers == read_capsule(base, dirs["odd"])[0].layers
    bank.replace("a", read_capsule(base, dirs["b"])[0])
    assert all(torch.equal(p, q) for p, q in zip(bank.capsules[0].parameters(), bank.capsules[1].parameters(),
                                                  strict=True))


def _storage_bytes(module: torch.nn.Module) -> int:
    return sum(t.untyped_storage().nbytes() for t in module.buffers()) + sum(
        t.untyped_storage().nbytes() for t in module.parameters())


def _heap_growth(build) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    try:
        built = build()
        gc.collect()
        return built, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # 1,002 capsules built under tracemalloc: about 6 s
def test_a_capsule_costs_the_bank_its_values_and_a_few_hundred_bytes(tmp_path):
    """The capsules' tensor storage is exactly their values plus a 16-byte index each; what else a capsule adds is
    its name's list slot and dict entry in the selector (64 bytes measured; the names are the caller's strings), not
    a module and its metadata (several KB)."""
    directory = _saved("t5", capt.CapsuleConfig(), 0, tmp_path / "one")
    values = read_capsule(BUILDERS["t5"](), directory)[0].vectors.nbytes  # (L, k, D) float32
    sizes, heaps = (2, 2, 1002), []  # the first build warms what any first build caches
    for count in sizes:
        base, dirs = BUILDERS["t5"](), {f"task-{i}": directory for i in range(count)}
        bank, heap = _heap_growth(functools.partial(capt.CapsuleBank, base, dirs))  # base, dirs: not counted
        assert _storage_bytes(bank.capsules) == count * (values + 16)
        heaps.append(heap)
        bank.detach()
    per_capsule = (heaps[2] - heaps[1]) / (sizes[2] - sizes[1])
    assert per_capsule < 100, per_capsule


def _head(labels: int, seed: int, bias: bool = True) -> TaskHead:
    generator = torch.Generator().manual_seed(seed)
    return TaskHead(torch.randn(labels, 8, generator=generator),
                    torch.randn(labels, generator=generator) if bias else None, "cls")


def test_heads_are_held_once_without_padding_and_each_row_gets_its_own_tasks_classes():
    heads = TaskHeads([_head(2, 0), _head(3, 1, bias=False)], hidden_size=8)
    assert not any(isinstance(value, TaskHead | list) and value and isinstance(value[0], TaskHead)
                   for value in vars(heads).values())
    # each head's own rows, 2 + 3 of them, not 2 heads x 3 classes; and two 8-byte longs per head
    assert _storage_bytes(heads) == (2 + 3) * 8 * 4 + (2 + 3) * 4 + 2 * 2 * 8
    heads.append(_head(5, 2))
    heads.replace(0, _head(4, 3))  # another label count: new rows
    heads.replace(1, _head(3, 4))  # the same count: over its own rows
    assert heads.weight.shape == (2 + 3 + 5 + 4, 8)
    given = [_head(4, 3), _head(3, 4), _head(5, 2)]
    states = torch.randn(4, 6, 8)
    rows = torch.tensor([2, 0, 1, 0])
    logits = heads(states, None, torch.ones(4, 6, dtype=torch.long), rows, (0, 1))
    assert heads.label_counts == [4, 3, 5] and logits.shape == (4, 5)
    for row, index in enumerate(rows.tolist()):
        head = given[index]
        expected = states[row, 0] @ head.weight.T + (0.0 if head.bias is None else head.bias)
        torch.testing.assert_close(logits[row, :head.num_labels], expected)
        assert torch.isinf(logits[row, head.num_labels:]).all() and (logits[row, head.num_labels:] < 0).all()


def test_a_bank_reads_name_folder_pairs_as_they_come_and_holds_one_head_at_a_time(tmp_path):
    """(name, folder) pairs from a generator, and heads from a function of the folder: each capsule is read, checked
    with its head in place and copied into the stacks before the next pair is asked for, so a bank of many capsules
    never holds more than one head (or one capsule module) at once; the bank equals the one built from mappings."""
    folders = [_saved("bert", capt.CapsuleConfig(), 400 + i, tmp_path / f"c{i}") for i in range(3)]
    base = BUILDERS["bert"]()
    own = capt.heads.linear_head(base)
    names = [f"task-{i}" for i in range(70)]  # more than one RowStack buffer of 64 rows
    yielded, live_heads_at_read = [], []
    heads_given: list = []

    def pairs():
        for i, name in enumerate(names):
            yielded.append(name)
            yield name, folders[i % 3]

    def head_of(folder):  # a TaskHead holds no cycle: it is freed when its last reference goes, no gc pass needed
        live_heads_at_read.append(sum(ref() is not None for ref in heads_given))
        assert len(yielded) == len(live_heads_at_read)  # asked for as its own pair comes, not all pairs first
        head = TaskHead(own.weight.detach().clone(), own.bias.detach().clone(), "cls")
        heads_given.append(weakref.ref(head))
        return head

    bank = capt.CapsuleBank(base, pairs(), heads=head_of)
    assert max(live_heads_at_read) <= 1 and len(live_heads_at_read) == 70  # the previous capsule's, still named
    assert bank.names == names and bank.heads.label_counts == [own.out_features] * 70
    stacked = bank.capsules.groups[0].vectors
    bank.detach()
    same = capt.CapsuleBank(base, {name: folders[i % 3] for i, name in enumerate(names)},
                            heads={name: TaskHead(own.weight.detach(), own.bias.detach(), "cls") for name in names})
    assert torch.equal(stacked, same.capsules.groups[0].vectors) and torch.equal(bank.heads.weight, same.heads.weight)
    assert not torch.equal(stacked[0], stacked[1])  # distinct capsules, in the pairs' order
    same.detach()


def test_a_bank_refuses_two_capsules_of_one_name_and_names_every_missing_head(tmp_path):
    folder = _saved("t5", capt.CapsuleConfig(), 0, tmp_path / "one")
    base = BUILDERS["t5"]()
    with pytest.raises(capt.CapsuleArtifactError, match="Two capsules are named 'a'"):
        capt.CapsuleBank(base, iter([("a", folder), ("b", folder), ("a", folder)]))
    with pytest.raises(capt.CapsuleArtifactError, match=r"No task head for capsule\(s\) \['b', 'c'\]"):
        capt.CapsuleBank(base, {"a": folder, "b": folder, "c": folder}, heads={"a": _head(2, 0)})
    with pytest.raises(capt.CapsuleArtifactError, match="at least one capsule"):
        capt.CapsuleBank(base, iter([]))
    capt.CapsuleBank(base, {"a": folder}).detach()  # nothing was attached to the base model by the refusals
