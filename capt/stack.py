"""The capsules a `CapsuleModel` holds: a list of trainable modules, or, in a serving bank, a stack stored once.

`CapsuleList` keeps one `Capsule` module per capsule (what training needs: each its own parameters). `CapsuleStack`
is a bank's: capsules of one configuration and layer set form a group whose values are stacked, (n, L, k, D), so
1,000 capsules cost their values and a few bytes of index each instead of 1,000 modules, and a batch that mixes
many of them fuses each capsule layer with one indexed gather per group instead of one pass per capsule.
Both answer the three questions the hooks ask: slot counts, the layers with a capsule, and the fused slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from capt.capsule import Capsule, combine, masked_mean
from capt.config import CapsuleConfig


class CapsuleList(nn.ModuleList):
    """One trainable `Capsule` module per capsule, fused one capsule at a time (the rows that use it)."""

    def slot_counts(self) -> set[int]:
        """The slot counts of the capsules (a model needs exactly one)."""
        return {capsule.config.num_slots for capsule in self}

    def capsule_layers(self) -> list[int]:
        """Stack layers where some capsule sits."""
        return sorted({i for capsule in self for i in capsule.layers})

    def fuse(self, layer: int, states: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None,
             slots: torch.Tensor) -> torch.Tensor:
        """`slots` (B, k, D) with each row whose capsule covers `layer` replaced by its fused capsule; `rows` (B,) is
        each row's capsule index (None: every row uses capsule 0)."""
        used = range(len(self)) if rows is None else rows.unique().tolist()
        for index in used:  # only the capsules of this batch's rows
            capsule = self[index]
            if not capsule.covers(layer):
                continue
            if rows is None:
                slots = capsule.fuse(layer, states, mask)
                continue
            chosen = (rows == index).nonzero().squeeze(1)
            slots = slots.index_copy(0, chosen, capsule.fuse(layer, states[chosen], mask[chosen]))
        return slots


class _Group(nn.Module):
    """Capsules sharing one configuration, layer set and width; each parameter stacked over them once, (n, ...)."""

    def __init__(self, first: Capsule, values: Sequence[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.config: CapsuleConfig = first.config
        self.layers, self.hidden_size = first.layers, first.hidden_size
        self._row = {layer: row for row, layer in enumerate(self.layers)}
        self.count = len(values)
        self.parameter_names = [name for name, _ in first.named_parameters()]
        for name in self.parameter_names:  # e.g. vectors (n, L, k, D)
            self.register_buffer(name, torch.stack([value[name] for value in values]))

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
        of this group: each row's values gathered in one `index_select`, then `Capsule.fuse`'s arithmetic."""
        row, cfg = self._row[layer], self.config
        task = self.vectors[:, row].index_select(0, members) if cfg.task_vector else None  # (b, k, D)
        if not cfg.instance_mean:
            return task.to(states.dtype)
        if cfg.fusion == "conv":
            mean = _conv_mean(states, mask, self.conv_weight[:, row].index_select(0, members))  # (b, D)
        else:
            mean = masked_mean(states, mask)  # (b, D)
        if cfg.fusion == "project":
            down = self.projection_down[:, row].index_select(0, members)  # (b, r, D)
            up = self.projection_up[:, row].index_select(0, members)  # (b, D, r)
            mean = mean + torch.bmm(up, torch.bmm(down, mean.unsqueeze(2))).squeeze(2)  # (b, D)
        return combine(cfg, task, mean).to(states.dtype)


def _key(capsule: Capsule | _Group) -> tuple:
    """What the capsules of one group share."""
    return capsule.config, capsule.layers, capsule.hidden_size


def _conv_mean(states: torch.Tensor, mask: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """(b, D): each row's depthwise convolution with its own `kernels` (b, D, K), then its masked mean."""
    batch, length, width = states.shape
    masked = states.to(torch.float32) * mask.to(torch.float32).unsqueeze(-1)  # (b, S, D), padding zeroed first
    flat = masked.transpose(1, 2).reshape(1, batch * width, length)  # one channel per (row, d)
    mixed = nn.functional.conv1d(flat, kernels.reshape(batch * width, 1, -1), padding="same", groups=batch * width)
    return masked_mean(mixed.reshape(batch, width, length).transpose(1, 2), mask)


class CapsuleStack(nn.Module):
    """A bank's capsules by index, stored as groups of stacked values; capsule i is `position[i]` of group
    `group[i]`. Read-only at serving time: the values are buffers, not parameters."""

    def __init__(self, capsules: Iterable[Capsule]) -> None:
        super().__init__()
        firsts: dict[tuple, Capsule] = {}
        values: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        where: list[tuple[int, int]] = []
        for capsule in capsules:  # taken one by one: only the values stay, not the modules
            key = _key(capsule)
            firsts.setdefault(key, capsule)
            group = values.setdefault(key, [])
            where.append((list(values).index(key), len(group)))
            group.append({name: p.detach() for name, p in capsule.named_parameters()})
        self.groups = nn.ModuleList(_Group(firsts[key], group) for key, group in values.items())
        device = next(self.groups.buffers(), torch.empty(0)).device  # the index lives beside the values
        places = torch.tensor(where, dtype=torch.long, device=device).reshape(-1, 2)  # (N, 2): group, position
        self.register_buffer("group", places[:, 0].contiguous(), persistent=False)
        self.register_buffer("position", places[:, 1].contiguous(), persistent=False)

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
            values = {name: p.detach() for name, p in capsule.named_parameters()}
            self.groups.append(_Group(capsule, [values]).to(self.group.device))
        place = torch.tensor([number, position], dtype=torch.long, device=self.group.device)
        if index == len(self):
            self.group = torch.cat([self.group, place[:1]])
            self.position = torch.cat([self.position, place[1:]])
        else:
            self.group[index], self.position[index] = place[0], place[1]

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
                fused = group.fuse(layer, states[chosen], mask[chosen], positions[chosen])
                slots = slots.index_copy(0, chosen, fused)
        return slots
