"""The capsules a `CapsuleModel` holds: a list of trainable modules, or, in a serving bank, a stack stored once.

`CapsuleList` keeps one `Capsule` module per capsule (what training needs: each its own parameters). `CapsuleStack`
is a bank's: capsules of one configuration and layer set form a group whose values are stacked, (n, L, k, D), so
1,000 capsules cost their values and a few bytes of index each instead of 1,000 modules, and a batch that mixes
many of them fuses each capsule layer with one indexed gather per group instead of one pass per capsule.
Both answer the three questions the hooks ask: slot counts, the layers with a capsule, and the fused slots.
"""

from __future__ import annotations

import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from capt.capsule import Capsule, MeanWeights, combine, masked_mean
from capt.config import CapsuleConfig
from capt.rows import RowStack


class CapsuleList(nn.ModuleList):
    """One trainable `Capsule` module per capsule. A batch of one capsule's rows goes through that capsule's own
    `fuse`; a batch mixing capsules (a pack) fuses each group of like capsules in one gather over their parameters
    stacked once per call (`route`), so a capsule layer costs the same few operations whatever the number of
    capsules, and none of them waits for the device."""

    def slot_counts(self) -> set[int]:
        """The slot counts of the capsules (a model needs exactly one)."""
        return {capsule.config.num_slots for capsule in self}

    def capsule_layers(self) -> list[int]:
        """Stack layers where some capsule sits."""
        return sorted({i for capsule in self for i in capsule.layers})

    def route(self, host_rows: torch.Tensor | None, rows: torch.Tensor | None) -> ListRoute | None:
        """Where each capsule's rows are, worked out once per call on the host from `host_rows` (B,) (CPU; `rows` is
        the same on the device): None when every row uses capsule 0."""
        if host_rows is None:
            return None
        present = torch.unique(host_rows).tolist()
        if len(present) == 1:
            return ListRoute(single=present[0])
        device = rows.device
        members: dict[tuple, list[int]] = {}
        for index in present:
            members.setdefault(_key(self[index]), []).append(index)
        groups = []
        for indices in members.values():
            position = torch.full((len(self),), -1, dtype=torch.long)
            position[indices] = torch.arange(len(indices))
            chosen = torch.isin(host_rows, torch.tensor(indices)).nonzero().squeeze(1)  # (b,) rows of this group
            whole = len(chosen) == len(host_rows)
            groups.append(_LiveGroup([self[i] for i in indices], None if whole else chosen.to(device),
                                     position[host_rows[chosen]].to(device)))
        return ListRoute(groups=groups)

    def fuse(self, layer: int, states: torch.Tensor, mask: torch.Tensor, route: ListRoute | None,
             slots: torch.Tensor) -> torch.Tensor:
        """`slots` (B, k, D) with each row whose capsule covers `layer` replaced by its fused capsule; `route` is
        `self.route(...)` of this call."""
        if route is None or route.single is not None:
            capsule = self[0 if route is None else route.single]
            return capsule.fuse(layer, states, mask) if capsule.covers(layer) else slots
        for group in route.groups:
            if not group.covers(layer):
                continue
            if group.chosen is None:  # every row of the batch is in this group
                slots = group.fuse(layer, states, mask)
                continue
            fused = group.fuse(layer, states.index_select(0, group.chosen), mask.index_select(0, group.chosen))
            slots = slots.index_copy(0, group.chosen, fused)
        return slots


@dataclass
class ListRoute:
    """A `CapsuleList`'s routing of one call's rows: one capsule for every row, or groups of like capsules."""

    single: int | None = None
    """The one capsule every row uses."""
    groups: list[_LiveGroup] = field(default_factory=list)
    """Otherwise: the groups of like capsules that the rows use."""


class _LiveGroup:
    """Trainable capsules of one configuration and layer set used by one call's rows; their parameters are stacked
    once for the call, (n, L, ...), so gradients reach each capsule's own parameters."""

    def __init__(self, capsules: list[Capsule], chosen: torch.Tensor | None, positions: torch.Tensor) -> None:
        self.capsules, self.chosen, self.positions = capsules, chosen, positions
        self.config = capsules[0].config
        self._values: dict[str, torch.Tensor] | None = None

    def covers(self, layer: int) -> bool:
        """Whether these capsules sit at stack layer `layer`."""
        return self.capsules[0].covers(layer)

    def fuse(self, layer: int, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(b, num_slots, D) slot states of this group's rows `states` (b, S, D)."""
        if self._values is None:
            names = [name for name, _ in self.capsules[0].named_parameters()]
            self._values = {name: torch.stack([c.get_parameter(name) for c in self.capsules]) for name in names}
        row = self.capsules[0].layers.index(layer)
        return fuse_rows(self.config, row, self._values, states, mask, self.positions)


class _Group(nn.Module):
    """Capsules sharing one configuration, layer set and width; each parameter stacked over them once, (n, ...)."""

    def __init__(self, first: Capsule, values: dict[str, torch.Tensor], count: int) -> None:
        super().__init__()
        self.config: CapsuleConfig = first.config
        self.layers, self.hidden_size = first.layers, first.hidden_size
        self._row = {layer: row for row, layer in enumerate(self.layers)}
        self.count = count
        self.parameter_names = [name for name, _ in first.named_parameters()]
        for name in self.parameter_names:  # e.g. vectors (n, L, k, D)
            self.register_buffer(name, values[name])

    def covers(self, layer: int) -> bool:
        """Whether this group's capsules sit at stack layer `layer`."""
        return layer in self._row

    def append(self, capsule: Capsule) -> int:
        """Hold `capsule` at the next position; that position."""
        for name in self.parameter_names:
            value = capsule.get_parameter(name).detach().to(getattr(self, name).device).unsqueeze(0)
            setattr(self, name, torch.cat([getattr(self, name), value]))
        self.count += 1
        return self.count - 1

    def put(self, position: int, capsule: Capsule) -> None:
        """Overwrite the capsule at `position` with `capsule`'s values."""
        for name in self.parameter_names:
            getattr(self, name)[position].copy_(capsule.get_parameter(name).detach())

    def capsule(self, position: int) -> Capsule:
        """A `Capsule` module holding a copy of the values at `position`."""
        like = getattr(self, self.parameter_names[0]) if self.parameter_names else None
        capsule = Capsule(self.config, self.layers, self.hidden_size, device=None if like is None else like.device)
        with torch.no_grad():
            for name in self.parameter_names:
                capsule.get_parameter(name).copy_(getattr(self, name)[position])
        return capsule.requires_grad_(False)

    def fuse(self, layer: int, states: torch.Tensor, mask: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
        """(b, num_slots, D) slot states for `layer` of rows `states` (b, S, D) whose capsules sit at `members` (b,)
        of this group."""
        values = {name: getattr(self, name) for name in self.parameter_names}
        return fuse_rows(self.config, self._row[layer], values, states, mask, members)


def fuse_rows(config: CapsuleConfig, row: int, values: dict[str, torch.Tensor], states: torch.Tensor,
              mask: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """`Capsule.fuse`'s arithmetic for rows of several capsules of one configuration: `values` holds their
    parameters stacked, (n, L, ...); row r of `states` (b, S, D) uses capsule `members[r]`; each row's values are
    gathered in one `index_select`. Capsule layer `row`: (b, num_slots, D)."""
    task = values["vectors"][:, row].index_select(0, members) if config.task_vector else None  # (b, k, D)
    if not config.instance_mean:
        return task.to(states.dtype)
    if config.fusion == "conv":
        mean = _conv_mean(states, mask, values["conv_weight"][:, row].index_select(0, members))  # (b, D)
    else:
        mean = masked_mean(states, mask)  # (b, D)
    if config.fusion == "project":
        down = values["projection_down"][:, row].index_select(0, members)  # (b, r, D)
        up = values["projection_up"][:, row].index_select(0, members)  # (b, D, r)
        mean = mean + torch.bmm(up, torch.bmm(down, mean.unsqueeze(2))).squeeze(2)  # (b, D)
    return combine(config, task, mean).to(states.dtype)


def _key(capsule: Capsule | _Group) -> tuple:
    """What the capsules of one group share."""
    return capsule.config, capsule.layers, capsule.hidden_size


def _conv_mean(states: torch.Tensor, mask: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """(b, D): each row's depthwise convolution with its own `kernels` (b, D, K), then its masked mean."""
    batch, length, width = states.shape
    prepared = MeanWeights.of(mask)
    masked = states.to(torch.float32) * prepared.weights  # (b, S, D), padding zeroed first
    flat = masked.transpose(1, 2).reshape(1, batch * width, length)  # one channel per (row, d)
    mixed = nn.functional.conv1d(flat, kernels.reshape(batch * width, 1, -1), padding="same", groups=batch * width)
    return masked_mean(mixed.reshape(batch, width, length).transpose(1, 2), prepared)


class CapsuleStack(nn.Module):
    """A bank's capsules by index, stored as groups of stacked values; capsule i is `position[i]` of group
    `group[i]`. Read-only at serving time: the values are buffers, not parameters."""

    def __init__(self, capsules: Iterable[Capsule]) -> None:
        super().__init__()
        firsts: dict[tuple, Capsule] = {}
        rows: dict[tuple, dict[str, RowStack]] = {}
        counts: dict[tuple, int] = {}
        group_of, position_of = array.array("q"), array.array("q")  # per capsule in turn: no Python object each
        for capsule in capsules:  # copied in one by one: each capsule's module can go once it is read
            key = _key(capsule)
            if key not in firsts:
                firsts[key], counts[key] = capsule, 0
                rows[key] = {name: RowStack() for name, _ in capsule.named_parameters()}
            group_of.append(list(firsts).index(key))
            position_of.append(counts[key])
            counts[key] += 1
            for name, parameter in capsule.named_parameters():
                rows[key][name].append(parameter.detach())
        self.groups = nn.ModuleList(
            _Group(firsts[key], {name: gathered.stacked() for name, gathered in rows[key].items()}, counts[key])
            for key in firsts)
        device = next(self.groups.buffers(), torch.empty(0)).device  # the index lives beside the values
        self.register_buffer("group", _index_tensor(group_of, device), persistent=False)
        self.register_buffer("position", _index_tensor(position_of, device), persistent=False)

    def __len__(self) -> int:
        return int(self.group.numel())

    def __getitem__(self, index: int) -> Capsule:
        """Capsule `index` as a module of its own (a copy, for inspection)."""
        return self.groups[int(self.group[index])].capsule(int(self.position[index]))

    def slot_counts(self) -> set[int]:
        """The slot counts of the groups (a bank needs exactly one)."""
        return {group.config.num_slots for group in self.groups}

    def capsule_layers(self) -> list[int]:
        """Stack layers where some capsule sits."""
        return sorted({i for group in self.groups for i in group.layers})

    def append(self, capsule: Capsule) -> None:
        """Hold `capsule` at the next index; the values held are not copied but for its group's (one `cat`)."""
        self._place(len(self), capsule)

    def replace(self, index: int, capsule: Capsule) -> None:
        """Capsule `index` takes `capsule`'s values (in place when it fits its group; else appended to a group)."""
        group = self.groups[int(self.group[index])]
        if _key(capsule) == _key(group):
            group.put(int(self.position[index]), capsule)
            return
        self._place(index, capsule)  # its old values stay unused in their group

    def _place(self, index: int, capsule: Capsule) -> None:
        keys = [_key(group) for group in self.groups]
        if _key(capsule) in keys:
            number = keys.index(_key(capsule))
            position = self.groups[number].append(capsule)
        else:
            number, position = len(self.groups), 0
            values = {name: p.detach().unsqueeze(0) for name, p in capsule.named_parameters()}
            self.groups.append(_Group(capsule, values, 1).to(self.group.device))
        place = torch.tensor([number, position], dtype=torch.long, device=self.group.device)
        if index == len(self):
            self.group = torch.cat([self.group, place[:1]])
            self.position = torch.cat([self.position, place[1:]])
        else:
            self.group[index], self.position[index] = place[0], place[1]

    def route(self, host_rows: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor | None:
        """The routing `fuse` takes: each row's capsule index `rows` (B,) on the device (the host copy is unused)."""
        return rows

    def fuse(self, layer: int, states: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None,
             slots: torch.Tensor) -> torch.Tensor:
        """`slots` (B, k, D) with each row whose capsule covers `layer` replaced by its fused capsule; `rows` (B,) is
        each row's capsule index (None: every row uses capsule 0). One gather per group, whatever the number of
        distinct capsules in the batch."""
        if rows is None:
            rows = torch.zeros(states.shape[0], dtype=torch.long, device=states.device)
        positions = self.position.index_select(0, rows)  # (B,)
        if len(self.groups) == 1:  # the usual bank: every capsule trained with one configuration
            group = self.groups[0]
            return group.fuse(layer, states, mask, positions) if group.covers(layer) else slots
        groups = self.group.index_select(0, rows)  # (B,)
        for number, group in enumerate(self.groups):
            chosen = (groups == number).nonzero().squeeze(1)
            if group.covers(layer) and chosen.numel():
                fused = group.fuse(layer, states[chosen], mask.index_select(0, chosen), positions[chosen])
                slots = slots.index_copy(0, chosen, fused)
        return slots


def _index_tensor(values: array.array, device: torch.device) -> torch.Tensor:
    """(N,) int64 on `device`, a copy of `values` (an empty array gives an empty tensor)."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(values, dtype=torch.long).clone().to(device)
