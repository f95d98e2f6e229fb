"""`Capsule`: the trainable vectors p_i of one task and the fusion that turns them into slot states."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from capt.config import CapsuleConfig
from capt.io import CapsuleMetadata, read_config, read_tensors, verify


@dataclass(frozen=True)
class MeanWeights:
    """A mean mask prepared once for every capsule layer of a forward pass: each layer's mean then costs a multiply,
    a sum and a divide, and no cast of the states (the multiply promotes them to float32)."""

    weights: torch.Tensor
    """(B, S, 1) float32: 1 where the mean looks, 0 elsewhere."""
    count: torch.Tensor
    """(B, 1) float32: the positions each row's mean covers, at least 1 (an empty row's mean is 0)."""

    @classmethod
    def of(cls, mask: torch.Tensor | MeanWeights) -> MeanWeights:
        """From a (B, S) mask of 0s and 1s; a mask already prepared is returned as it is."""
        if isinstance(mask, MeanWeights):
            return mask
        weights = mask.to(torch.float32).unsqueeze(-1)  # (B, S, 1)
        return cls(weights, weights.sum(dim=1).clamp_min(1.0))

    def index_select(self, dim: int, rows: torch.Tensor) -> MeanWeights:
        """The rows `rows` (b,) of this mask (`dim` 0), as `Tensor.index_select` selects a plain mask's."""
        if dim != 0:
            raise ValueError("MeanWeights selects rows only (dim=0).")
        return MeanWeights(self.weights.index_select(0, rows), self.count.index_select(0, rows))


_PROMOTED_TO_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)
"""State dtypes whose product with float32 weights is the float32 product of their float32 values."""


def masked_mean(states: torch.Tensor, mask: torch.Tensor | MeanWeights) -> torch.Tensor:
    """Mean over positions where `mask` is 1, in float32: (B, S, D), (B, S) -> (B, D); empty rows give 0. `mask` may
    come prepared (`MeanWeights`), as the capsule layers of one pass share it."""
    prepared = MeanWeights.of(mask)
    if states.dtype not in _PROMOTED_TO_FLOAT32:
        states = states.to(torch.float32)
    return (states * prepared.weights).sum(dim=1) / prepared.count  # (B, D) float32


def combine(config: CapsuleConfig, task: torch.Tensor | None, mean: torch.Tensor) -> torch.Tensor:
    """The slot states from the task part `task` ((b, k, D), or one capsule's (k, D) for every row; None without task
    vectors) and the (fused) instance mean `mean` (b, D): (b, num_slots, D)."""
    if config.fusion == "prepend":
        return torch.cat([_rows(task, mean.shape[0]), mean.unsqueeze(1)], dim=1)  # (b, k+1, D)
    if task is None:
        return mean.unsqueeze(1).expand(mean.shape[0], config.length, -1)
    return task + mean.unsqueeze(1)  # (k, D) broadcasts over the rows


def _rows(task: torch.Tensor, batch: int) -> torch.Tensor:
    """(b, k, D) from a task part that may be one capsule's (k, D)."""
    return task.unsqueeze(0).expand(batch, -1, -1) if task.dim() == 2 else task


class Capsule(nn.Module):
    """One task's capsule over its layers: S_i = fuse(p_i, Mean(states before layer i)).

    Parameters are stacked over the capsule layers (row j belongs to `layers[j]`):
    `vectors` (L, k, D) always when `task_vector`; for fusion="project" the low-rank map
    S = p + m + U (V m) with `projection_up` U (L, D, r) zero-initialised and `projection_down` V (L, r, D)
    drawn from N(0, 1/D) (so S = p + m at step 0, and U receives a gradient from the first step);
    `conv_weight` (L, D, K) for fusion="conv" (a depthwise convolution over the sequence before the mean,
    initialised to the identity tap).
    """

    def __init__(self, config: CapsuleConfig, layers: tuple[int, ...], hidden_size: int,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.layers = tuple(layers)
        self.hidden_size = hidden_size
        self._row = {layer: row for row, layer in enumerate(self.layers)}
        count, k, d = len(self.layers), config.length, hidden_size
        factory = {"device": device, "dtype": torch.float32}
        if config.task_vector:
            self.vectors = nn.Parameter(torch.zeros(count, k, d, **factory))
        if config.fusion == "project":
            config.check_hidden_size(d)
            rank = config.project_rank
            self.projection_up = nn.Parameter(torch.zeros(count, d, rank, **factory))
            self.projection_down = nn.Parameter(torch.randn(count, rank, d, **factory) / d**0.5)
        if config.fusion == "conv":
            weight = torch.zeros(count, d, config.conv_kernel, **factory)
            weight[:, :, config.conv_kernel // 2] = 1.0
            self.conv_weight = nn.Parameter(weight)
        self.reset_vectors()

    def reset_vectors(self) -> None:
        """(Re)initialise the task vectors as the config says."""
        if not self.config.task_vector or self.vectors.is_meta:
            return
        with torch.no_grad():
            if self.config.init == "normal":
                self.vectors.normal_(0.0, self.config.init_std)
            else:
                self.vectors.zero_()

    def covers(self, layer: int) -> bool:
        """Whether layer `layer` of the stack has a capsule of this task."""
        return layer in self._row

    def fuse(self, layer: int, states: torch.Tensor, mean_mask: torch.Tensor) -> torch.Tensor:
        """Slot states for `layer`: (b, S, D), (b, S) -> (b, num_slots, D) in the dtype of `states`."""
        row = self._row[layer]
        cfg = self.config
        task = self._task_part(row, states.device)  # (k, D) or None
        if not cfg.instance_mean:
            # cast after expanding, so that the rows' gradients are summed in float32
            return _rows(task, states.shape[0]).to(states.dtype)
        mean = self._instance_mean(row, states, mean_mask)  # (b, D)
        if cfg.fusion == "project":
            low_rank = mean @ self.projection_down[row].T  # (b, r)
            mean = mean + low_rank @ self.projection_up[row].T  # (b, D)
        return combine(cfg, task, mean).to(states.dtype)

    def _task_part(self, row: int, device: torch.device) -> torch.Tensor | None:
        if not self.config.task_vector:
            return None
        task = self.vectors[row]  # (k, D)
        return task if task.device == device else task.to(device)

    def _instance_mean(self, row: int, states: torch.Tensor, mean_mask: torch.Tensor) -> torch.Tensor:
        if self.config.fusion != "conv":
            return masked_mean(states, mean_mask)
        # Padding is zeroed first so it never leaks into a real token's window.
        prepared = MeanWeights.of(mean_mask)
        masked = states.to(torch.float32) * prepared.weights  # (b, S, D)
        kernel = self.conv_weight[row].unsqueeze(1)  # (D, 1, K)
        mixed = nn.functional.conv1d(masked.transpose(1, 2), kernel, padding="same", groups=kernel.shape[0])
        return masked_mean(mixed.transpose(1, 2), prepared)

    def extra_repr(self) -> str:
        return f"layers={list(self.layers)}, hidden_size={self.hidden_size}, config={self.config}"


def read_capsule(base_model: nn.Module, directory: str | os.PathLike, strict: bool = True
                 ) -> tuple[Capsule, CapsuleMetadata]:
    """The capsule saved in `directory`, checked against `base_model`, on its device (not yet attached).

    `strict=False` accepts a base model whose weights differ (same architecture) with a warning. Before any
    value is used, the files are verified against their digest manifest (`capt.digest`); no option skips that.
    The structural checks run first (they parse without using anything) so that a damaged file is named
    for what is wrong with it.
    """
    config, metadata = read_config(base_model, directory, strict)
    device = next(base_model.parameters()).device
    capsule = Capsule(config, tuple(metadata.layers), metadata.hidden_size, device=device)
    shapes = {name: tuple(t.shape) for name, t in capsule.state_dict().items()}
    tensors = read_tensors(directory, shapes)
    verify(directory)
    with torch.no_grad():
        for name, param in capsule.named_parameters():
            param.copy_(tensors[name])
    return capsule, metadata
