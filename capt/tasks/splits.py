"""The paper's splits: a label-stratified, seeded 90/10 cut of the official train split; subsampling.

The unit of splitting is one example, except for MultiRC, where it is one question group (all answer
rows of a question stay together) and groups are stratified by their majority label. Within each
stratum the units are shuffled with ``random.Random(f"capt-split:{seed}")`` and the first
``round(n * fraction)`` (half up) go to validation, so each label's validation count is within one
example of its exact share. Returned splits keep the original row order.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence

from capt.tasks.records import Example


def units(examples: Sequence[Example]) -> list[list[int]]:
    """Indices grouped into splitting units: one per question group, else one per example."""
    if not examples or examples[0].group is None:
        return [[i] for i in range(len(examples))]
    by_group: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        by_group.setdefault(example.group or example.uid, []).append(i)
    return list(by_group.values())


def _stratum(examples: Sequence[Example], unit: list[int]) -> int:
    """Label of a single example; majority label of a group (ties go to the positive label 1)."""
    if len(unit) == 1:
        return examples[unit[0]].label
    positives = sum(examples[i].label for i in unit)
    return int(2 * positives >= len(unit))


def split_train_validation(examples: Sequence[Example], fraction: float = 0.1,
                           seed: int = 0) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """(train, validation): `fraction` of the units per stratum go to validation; deterministic in seed."""
    all_units = units(examples)
    strata: dict[int, list[int]] = defaultdict(list)
    for u, unit in enumerate(all_units):
        strata[_stratum(examples, unit)].append(u)
    rng = random.Random(f"capt-split:{seed}")
    held: set[int] = set()
    for key in sorted(strata):
        members = list(strata[key])
        rng.shuffle(members)
        held.update(members[: int(len(members) * fraction + 0.5)])
    if not held and len(all_units) > 1:
        largest = max(sorted(strata), key=lambda k: len(strata[k]))
        held.add(rng.choice(strata[largest]))
    if len(held) == len(all_units) and len(all_units) > 1:
        held.discard(min(held))
    return _take(examples, all_units, lambda u: u not in held), _take(examples, all_units, held.__contains__)


def subsample(examples: Sequence[Example], limit: int | None, seed: int = 0) -> tuple[Example, ...]:
    """At most `limit` examples chosen at random by seed (MultiRC: whole question groups), in order."""
    if limit is None or limit >= len(examples):
        return tuple(examples)
    all_units = units(examples)
    order = list(range(len(all_units)))
    random.Random(f"capt-subsample:{seed}").shuffle(order)
    chosen: set[int] = set()
    total = 0
    for u in order:
        size = len(all_units[u])
        if chosen and total + size > limit:
            continue
        chosen.add(u)
        total += size
        if total >= limit:
            break
    return _take(examples, all_units, chosen.__contains__)


def _take(examples: Sequence[Example], all_units: list[list[int]],
          keep: Callable[[int], bool]) -> tuple[Example, ...]:
    picked = sorted(i for u, unit in enumerate(all_units) if keep(u) for i in unit)
    return tuple(examples[i] for i in picked)
