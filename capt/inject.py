"""`attach` / `CapsuleModel`: the capsule slot, the per-layer overwrite hooks, masks and generation.

The slot design: zero vectors are inserted into `inputs_embeds` (and ones into the attention mask) so the
model itself computes positions, rotary embeddings, relative position bias and masks for length n+k; a
forward pre-hook on each capsule layer overwrites the slot states with the fused capsule. Cached decode
steps are shorter than the prefill and are left alone: the slot's keys and values were cached at prefill.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capt.arch import ArchSpec, spec_for, strip_slots
from capt.capsule import Capsule, MeanWeights, read_capsule
from capt.config import CapsuleConfig
from capt.errors import CapsuleArtifactError, CapsuleConfigError, CaptError
from capt.io import describe, write_capsule
from capt.phases import SinglePhase
from capt.slots import CapsuleSelector, insert_slots, match_batch, shift_causal_labels
from capt.stack import CapsuleList, CapsuleStack

_ATTACHED = "_capt_capsule_model_attached"


@dataclass
class PassContext:
    """What the hooks need during one forward or generate call (`CapsuleModel._prepare` makes it)."""

    total_len: int
    """Sequence length of the prefill, slots included; shorter hidden states are cached decode steps."""
    first_mask: torch.Tensor
    """(B, S) mean mask for the first layer of the stack: tokens only (the slot holds no state yet)."""
    rest_mask: torch.Tensor
    """(B, S) mean mask for later layers: tokens and slots."""
    row_capsule: torch.Tensor | None
    """(B,) capsule index per row, or None when every row uses capsule 0."""
    host_rows: torch.Tensor | None = None
    """`row_capsule` on the host (CPU)."""
    prepared: dict[tuple[bool, int], MeanWeights] = field(default_factory=dict)
    """The mean masks by (first layer, batch size), prepared once (`mean_weights`)."""
    routes: dict[int, Any] = field(default_factory=dict)
    """The capsules' routing of the rows by batch size (`generate` may expand the batch), worked out once."""

    def mean_weights(self, first: bool, batch: int) -> MeanWeights:
        """The first layer's (`first`) or the later layers' mean mask for a batch of `batch` rows, prepared once."""
        key = (first, batch)
        if key not in self.prepared:
            self.prepared[key] = MeanWeights.of(match_batch(self.first_mask if first else self.rest_mask, batch))
        return self.prepared[key]

    def route(self, capsules: Any, batch: int) -> Any:
        """`capsules.route` (a `capt.stack.CapsuleList` or `CapsuleStack`) of this call's rows for a batch of `batch`
        rows."""
        if batch not in self.routes:
            host = None if self.host_rows is None else match_batch(self.host_rows, batch)
            rows = None if self.row_capsule is None else match_batch(self.row_capsule, batch)
            self.routes[batch] = capsules.route(host, rows)
        return self.routes[batch]


class CapsuleModel(SinglePhase, nn.Module):
    """A frozen base model with one or more capsules; `forward`/`generate` mirror the base model's.

    It implements `capt.methods.MethodModel` as the method "capt".
    """

    method = "capt"
    """The method's name in `capt.methods.METHODS`."""
    packs_capsules = True
    """Jobs of this method (CaPT and its ablations) can train together on one frozen base (`capt.packing`)."""

    def __init__(self, base_model: nn.Module, capsules: Sequence[Capsule], names: Sequence[str] | None = None,
                 spec: ArchSpec | None = None) -> None:
        super().__init__()
        if getattr(base_model, _ATTACHED, False):
            raise CaptError("This base model already has capsules attached; call detach() on that CapsuleModel first.")
        # a bank gives its capsules stacked (`capt.stack.CapsuleStack`); training keeps one module per capsule
        self.capsules = capsules if isinstance(capsules, CapsuleStack) else CapsuleList(capsules)
        slot_counts = sorted(self.capsules.slot_counts())
        if len(slot_counts) != 1:
            raise CapsuleConfigError(
                f"Capsules sharing one model must occupy the same number of slots; got {slot_counts}."
            )
        self.spec = spec or spec_for(base_model)
        self.base_model = base_model
        self.selector = CapsuleSelector(names if names is not None else ["default"] * len(capsules))
        self.num_slots = slot_counts[0]
        self._requires_grad = {name: p.requires_grad for name, p in base_model.named_parameters()}
        base_model.requires_grad_(False)
        self._pass: PassContext | None = None
        self._handles = self._register_hooks()
        setattr(base_model, _ATTACHED, True)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("base_model", "_modules"):
                raise
            return getattr(self.base_model, name)

    def _register_hooks(self) -> list:
        layers = self.spec.find_layers(self.base_model)
        return [layers[i].register_forward_pre_hook(partial(self._pre_hook, i), with_kwargs=True)
                for i in self.capsules.capsule_layers()]

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The capsule parameters, and nothing of the base model."""
        return (p for p in self.capsules.parameters() if p.requires_grad)

    def parameter_groups(self) -> list[tuple[list[nn.Parameter], float | None]]:
        """One group of every capsule parameter, at the job's learning rate (None)."""
        return [(list(self.trainable_parameters()), None)]

    @classmethod
    def apply(cls, model: nn.Module, config: CapsuleConfig | None = None) -> CapsuleModel:
        """`attach(model, config)`: the registry's way to adapt a base model."""
        return attach(model, config)

    def save(self, directory: str | os.PathLike, task: str | None = None,
             metrics: Mapping[str, float] | None = None, overwrite: bool = False) -> Path:
        """Write this single-capsule model's artifact (`capt.io`), recording `task` and `metrics`."""
        if len(self.capsules) != 1:
            raise CapsuleArtifactError(f"save_capsule saves one capsule; this model holds {len(self.capsules)}.")
        capsule = self.capsules[0]
        metadata = describe(self.base_model, capsule.config, capsule.layers, task, metrics)
        return write_capsule(directory, capsule.state_dict(), metadata, overwrite)

    @classmethod
    def load(cls, base_model: nn.Module, directory: str | os.PathLike, strict: bool = True) -> CapsuleModel:
        """The capsule saved in `directory` on `base_model`, the model it was trained on (`strict=False`: or one of
        the same architecture with other weights, with a warning)."""
        capsule, metadata = read_capsule(base_model, directory, strict)
        return CapsuleModel(base_model, [capsule], names=[metadata.task or "default"])

    @property
    def added_positions(self) -> int:
        """The capsule slots this model inserts into every input."""
        return self.num_slots

    @property
    def slot_span(self) -> tuple[int, int]:
        """[start, stop) positions of the capsule slots in the sequence the base model sees."""
        return self.spec.slot_offset, self.spec.slot_offset + self.num_slots

    def detach(self) -> nn.Module:
        """Remove every hook, restore `requires_grad`, and return the untouched base model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, param in self.base_model.named_parameters():
            param.requires_grad_(self._requires_grad.get(name, param.requires_grad))
        if hasattr(self.base_model, _ATTACHED):
            delattr(self.base_model, _ATTACHED)
        return self.base_model

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                prompt_mask=None, capsule=None, **kwargs):
        """The base model's forward with the capsule in place; slots are removed from the outputs.

        `prompt_mask` (B, T) (decoder-only) marks the tokens the instance mean may see; by default the
        attended tokens whose label is -100, i.e. the prompt when `labels` supervise the answer only.
        `capsule` picks a capsule per row (names or indices) when several share the model.
        """
        if kwargs.get("return_dict") is False:
            raise CaptError("CapsuleModel.forward needs return_dict=True to remove the capsule slots.")
        for key in ("past_key_values", "cache", "position_ids"):
            if kwargs.get(key) is not None:
                raise CaptError(f"CapsuleModel.forward does not take {key}=...: use generate() for cached "
                                "decoding; positions are derived from the attention mask.")
        model_kwargs, ctx = self._prepare(input_ids, attention_mask, inputs_embeds, prompt_mask, labels, capsule,
                                          kwargs)
        with self._active(ctx):
            output = self.base_model(**model_kwargs)
        return strip_slots(output, self.spec, *self.slot_span)

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, inputs_embeds=None, prompt_mask=None, capsule=None,
                 **kwargs):
        """`base_model.generate` with the capsule; the KV cache holds the slot from the prefill on.

        Decoder-only models return prompt + new tokens, as `generate(input_ids=...)` does on the base model.
        """
        model_kwargs, ctx = self._prepare(input_ids, attention_mask, inputs_embeds, prompt_mask, None, capsule,
                                          kwargs)
        with self._active(ctx):
            result = self.base_model.generate(**model_kwargs)
        if not self.spec.generation_echoes_prompt or input_ids is None:
            return result
        sequences = result if isinstance(result, torch.Tensor) else result.sequences
        sequences = torch.cat([match_batch(input_ids, sequences.shape[0]), sequences], dim=1)
        if isinstance(result, torch.Tensor):
            return sequences
        result["sequences"] = sequences
        return result

    def _prepare(self, input_ids, attention_mask, inputs_embeds, prompt_mask, labels, capsule, kwargs):
        """Model kwargs with the slots inserted, and the hook context for this call."""
        if inputs_embeds is None:
            if input_ids is None:
                raise CaptError("Pass input_ids or inputs_embeds.")
            inputs_embeds = self.base_model.get_input_embeddings()(input_ids)  # (B, T, D)
        batch, length, _ = inputs_embeds.shape
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.long, device=inputs_embeds.device)
        start, stop = self.slot_span
        mean_tokens = self._mean_tokens(attention_mask, prompt_mask, labels)
        model_kwargs = dict(kwargs)
        model_kwargs["inputs_embeds"] = insert_slots(inputs_embeds, start, stop, 0.0)  # (B, T+k, D)
        model_kwargs["attention_mask"] = insert_slots(attention_mask, start, stop, 1)
        if kwargs.get("token_type_ids") is not None:
            model_kwargs["token_type_ids"] = insert_slots(kwargs["token_type_ids"], start, stop, 0)
        if labels is not None:
            model_kwargs["labels"] = self._slot_labels(labels, length)
        host_rows = self.selector.rows(capsule, batch, len(self.capsules))
        ctx = PassContext(
            total_len=length + self.num_slots,
            first_mask=insert_slots(mean_tokens, start, stop, 0),
            rest_mask=insert_slots(mean_tokens, start, stop, 1),
            row_capsule=None if host_rows is None else host_rows.to(inputs_embeds.device),
            host_rows=host_rows,
        )
        return model_kwargs, ctx

    def _mean_tokens(self, attention_mask, prompt_mask, labels) -> torch.Tensor:
        """(B, T) tokens the instance mean covers: padding never; answers never in decoder-only models."""
        if not self.spec.mean_over_prompt:
            return attention_mask
        if prompt_mask is not None:
            return attention_mask * prompt_mask.to(attention_mask.dtype)
        if labels is not None:
            return attention_mask * (labels == -100).to(attention_mask.dtype)
        return attention_mask

    def _slot_labels(self, labels: torch.Tensor, length: int) -> torch.Tensor:
        start, stop = self.slot_span
        if self.spec.shifts_labels:
            return shift_causal_labels(labels, start, stop)
        if labels.dim() == 2 and labels.dtype == torch.long and labels.shape[1] == length and self.spec.classifier_head:
            return insert_slots(labels, start, stop, -100)  # token classification
        return labels

    @contextmanager
    def _active(self, ctx: PassContext):
        if self._pass is not None:
            raise CaptError("CapsuleModel calls cannot be nested.")
        self._pass = ctx
        try:
            yield
        finally:
            self._pass = None

    def _pre_hook(self, layer: int, module: nn.Module, args: tuple, kwargs: dict):
        ctx = self._pass
        if ctx is None:
            return None
        states = args[0] if args else kwargs["hidden_states"]  # (B, S, D)
        if states.shape[1] != ctx.total_len:
            return None  # cached decode step
        states = self._overwrite(layer, states, ctx)
        if args:
            return (states, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": states}

    def _overwrite(self, layer: int, states: torch.Tensor, ctx: PassContext) -> torch.Tensor:
        """Replace the slot states before `layer` with each row's fused capsule."""
        start, stop = self.slot_span
        batch = states.shape[0]
        mask = ctx.mean_weights(layer == 0, batch)
        slots = states[:, start:stop]  # (B, k, D)
        slots = self.capsules.fuse(layer, states, mask, ctx.route(self.capsules, batch), slots)  # (B, k, D)
        # one op forward and one backward, where slicing and concatenating costs five (this runs at every layer)
        return torch.slice_scatter(states, slots, dim=1, start=start, end=stop)  # (B, S, D)


def attach(model: nn.Module, config: CapsuleConfig | None = None) -> CapsuleModel:
    """Freeze `model` and give it one capsule described by `config` (default: CaPT as in the paper)."""
    config = config or CapsuleConfig()
    spec = spec_for(model)
    num_layers = spec.num_layers(model)
    device = next(model.parameters()).device
    capsule = Capsule(config, config.resolve_layers(num_layers), spec.hidden_size(model), device=device)
    return CapsuleModel(model, [capsule], spec=spec)


load_capsule = CapsuleModel.load
"""`capt.load_capsule(base_model, directory, strict=True)`."""
save_capsule = CapsuleModel.save
"""`capt.save_capsule(model, directory, task=None, metrics=None, overwrite=False)`."""
