"""``AdaptedModel``: the one interface every baseline method implements."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capt.baselines import io as adapter_io
from capt.baselines.config import BaselineConfig
from capt.baselines.info import ModelInfo, baseline_spec, model_info
from capt.errors import AdapterError, DetachedError, MethodError, UnsupportedCallError
from capt.methods import METHODS, apply_method
from capt.phases import SinglePhase

logger = logging.getLogger(__name__)

_MARKER = "_capt_baseline_attached"


class AdaptedModel(SinglePhase, nn.Module):
    """A base model plus one baseline method.

    ``forward(**kwargs)`` takes the base model's arguments and returns the base model's output type;
    ``generate(input_ids, attention_mask, **kw)`` returns what ``base.generate`` returns for the same
    inputs; ``trainable_parameters()`` yields only the method's parameters. The base model is available
    as ``self.base`` (``self.base_model``); ``detach()`` hands it back with the method removed. It
    implements ``capt.methods.MethodModel``.
    """

    def __init__(self, base: nn.Module, config: BaselineConfig) -> None:
        super().__init__()
        if getattr(base, _MARKER, False):
            raise MethodError("this model already carries a baseline adapter; detach() it first")
        self.spec = baseline_spec(base)
        """The ``capt.arch`` spec of the base model: where its layers and attention modules are."""
        self.info: ModelInfo = model_info(base)
        self.adapter_config = config
        """The method's config (``self.base.config`` stays the Hugging Face model config)."""
        self.base = base
        object.__setattr__(base, _MARKER, True)
        self._detached = False
        self._grad_flags = [(p, p.requires_grad) for p in base.parameters()]

    @classmethod
    def apply(cls, model: nn.Module, config: BaselineConfig) -> AdaptedModel:
        """Wrap ``model`` with this method (a clear error for unsupported models before anything changes)."""
        baseline_spec(model)
        return cls(model, config)

    @classmethod
    def load(cls, base_model: nn.Module, directory: str | os.PathLike) -> AdaptedModel:
        """``load_adapter(base_model, directory)``, refusing an adapter of another method than ``cls``."""
        adapted = load_adapter(base_model, directory)
        if not isinstance(adapted, cls):
            adapted.detach()
            raise AdapterError(f"{directory} holds a {adapted.method} adapter, not one of {cls.__name__}.")
        return adapted

    @property
    def base_model(self) -> nn.Module:
        """The wrapped base model (``self.base``), as every ``MethodModel`` names it."""
        return self.base

    @property
    def method(self) -> str:
        """Name of the method (a key of ``capt.baselines.METHODS``)."""
        return self.adapter_config.method

    @property
    def added_positions(self) -> int:
        """The positions this model inserts into every input (`sequence_overhead` of its config)."""
        return self.adapter_config.sequence_overhead()

    @property
    def family(self) -> str:
        """``"t5"``, ``"decoder"`` or ``"encoder"``."""
        return self.info.family

    def freeze_base(self) -> None:
        """Set ``requires_grad=False`` on every base-model parameter."""
        for param in self.base.parameters():
            param.requires_grad_(False)

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """Named parameters that make up this method's artifact (overridden per method)."""
        raise NotImplementedError

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The method's trainable parameters (full fine-tuning: all base parameters)."""
        yield from self.adapter_parameters().values()

    def parameter_groups(self) -> list[tuple[list[nn.Parameter], float | None]]:
        """One group, at the job's learning rate (None): methods with a second learning rate override this."""
        return [(list(self.trainable_parameters()), None)]

    def num_trainable_parameters(self) -> int:
        """Number of scalars in ``trainable_parameters()``."""
        return sum(p.numel() for p in self.trainable_parameters())

    def artifact_config(self) -> BaselineConfig:
        """The config an artifact of this model records: its own, unless training-only parts are dropped on save."""
        return self.adapter_config

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Detached, contiguous CPU copies of the adapter tensors, keyed as in ``adapter_parameters``."""
        return {k: p.detach().to("cpu").contiguous().clone() for k, p in self.adapter_parameters().items()}

    @torch.no_grad()
    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` into the adapter parameters; names and shapes must match exactly."""
        params = self.adapter_parameters()
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        wrong = sorted(k for k in set(params) & set(state) if tuple(state[k].shape) != tuple(params[k].shape))
        if missing or unexpected or wrong:
            shapes = {k: (tuple(state[k].shape), tuple(params[k].shape)) for k in wrong}
            raise MethodError(
                f"adapter tensors do not fit this model: missing={missing}, unexpected={unexpected}, "
                f"shape (file, model)={shapes}"
            )
        for key, param in params.items():
            param.copy_(state[key].to(dtype=param.dtype, device=param.device))

    def save(self, directory: str | os.PathLike, task: str | None = None,
             metrics: Mapping[str, float] | None = None, overwrite: bool = False) -> Path:
        """``save_adapter``; the adapter format records no task or metrics (the caller keeps those)."""
        return self.save_adapter(directory, overwrite=overwrite)

    def save_adapter(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write the adapter (safetensors + JSON metadata) to ``directory``; see ``capt.baselines.io``."""
        state = self.adapter_state_dict()
        metadata = adapter_io.describe(self.method, self.artifact_config().to_dict(), self.info, state)
        return adapter_io.write_adapter(directory, state, metadata, overwrite)

    def forward(self, **kwargs: Any) -> Any:
        """Run the base model with the method applied.

        ``prompt_mask`` (B, n), marking the prompt tokens of decoder-only inputs, is accepted by every
        method so callers can treat them alike; only prompt tuning's instance token uses it.
        """
        kwargs.pop("prompt_mask", None)
        return self.base(**kwargs)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """``base.generate`` with the method applied (decoder-only: prompt + new tokens)."""
        self._require_generate()
        kwargs.pop("prompt_mask", None)
        return self.base.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def _require_generate(self) -> None:
        if not hasattr(self.base, "generate") or self.spec.classifier_head:
            raise UnsupportedCallError(f"{type(self.base).__name__} ({self.family} family) does not generate text")

    def _release(self) -> None:
        """Undo the method's changes to the base model (overridden per method)."""

    def detach(self) -> nn.Module:
        """Remove the method and return the base model, with its parameters' ``requires_grad`` as before."""
        if self._detached:
            raise DetachedError("adapter already detached")
        self._release()
        base = self.base
        for param, flag in self._grad_flags:
            param.requires_grad_(flag)
        object.__setattr__(base, _MARKER, False)
        self._detached = True
        logger.info("detached %s from %s", self.method, type(base).__name__)
        return base


def load_adapter(base_model: nn.Module, directory: str | os.PathLike) -> AdaptedModel:
    """Rebuild the saved method on ``base_model`` and load its weights; raise ``AdapterError`` on mismatch.

    Before any value is used, the files are verified against their digest manifest (``capt.digest``), after the
    structural checks (which parse without using anything, and name what is wrong with a damaged file).
    """
    meta = adapter_io.read_metadata(directory)
    entry = METHODS.get(meta["method"])
    if entry is None or not issubclass(entry.model_class, AdaptedModel):
        known = sorted(name for name, e in METHODS.items() if issubclass(e.model_class, AdaptedModel))
        raise AdapterError(f"{Path(directory) / adapter_io.META_NAME}: method={meta['method']!r} (allowed: {known})")
    adapter_io.check_compatible(meta, base_model, directory)
    config = adapter_io.read_config(meta, entry.config_class, directory)
    state = adapter_io.read_tensors(directory, meta)
    adapter_io.verify(directory)
    adapted = apply_method(base_model, config)
    try:
        adapted.load_adapter_state_dict(state)
    except ValueError as exc:
        adapted.detach()
        raise AdapterError(str(exc)) from exc
    logger.info("loaded %s adapter from %s", meta["method"], directory)
    return adapted
