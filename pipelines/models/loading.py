"""Base models and tokenizers loaded by name: built-in offline models, the MiniLM package, or Hugging Face
checkpoints."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from capt.arch import ArchSpec, spec_for, spec_for_model_type, supported_model_types
from pipelines.models import smollm2
from pipelines.models.tiny import TINY_MODELS

_TINY_WEIGHTS_SEED = 1234  # tiny base models are the same frozen "checkpoint" in every job and process


@dataclass
class LoadedModel:
    """A base model with its tokenizer and family."""

    model: nn.Module
    """The frozen base model."""
    tokenizer: Any
    """Its tokenizer."""
    family: str
    """"t5", "decoder" or "encoder" (the task formats' key)."""

    @property
    def spec(self) -> ArchSpec:
        """The `capt.arch` spec of the model: every family-dependent behaviour is a property of it."""
        return spec_for(self.model)


def load_model(name: str, num_labels: int, dtype: str = "float32") -> LoadedModel:
    """Load (or build) the base model `name`; encoder-only models get a `num_labels`-way linear head."""
    torch_dtype = getattr(torch, dtype)
    if name in TINY_MODELS:
        from capt.tasks import test_tokenizer
        from pipelines.models import tiny as tiny_models

        family = {"tiny-t5": "t5", "tiny-bert": "encoder"}.get(name, "decoder")
        tokenizer = test_tokenizer(family)
        ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
               "bos_token_id": tokenizer.bos_token_id}
        with _seeded(_TINY_WEIGHTS_SEED):
            model = tiny_models.instantiate(name, tiny_models.config(name, len(tokenizer), ids, num_labels))
        model.config._name_or_path = name
        loaded = LoadedModel(model.eval(), tokenizer, family)
    elif name in ("minilm", smollm2.NAME):  # a folder of its own package, or the converted GGUF checkpoint
        from capt.tasks.tokenizers import minilm_model_path

        folder = minilm_model_path() if name == "minilm" else smollm2.ensure_checkpoint()
        loaded = _pretrained(str(folder), num_labels)
        loaded.model.config._name_or_path = name
    else:
        loaded = _pretrained(name, num_labels)
    loaded.model.to(torch_dtype)
    return loaded


def _pretrained(name: str, num_labels: int) -> LoadedModel:
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(name)
    spec = spec_for_model_type(config.model_type)
    if spec is None:
        raise ValueError(f"model.name={name!r} has model_type={config.model_type!r}; supported model types: "
                         f"{', '.join(supported_model_types())}.")
    tokenizer = AutoTokenizer.from_pretrained(name)
    if spec.pad_with_eos and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    auto_class = getattr(transformers, spec.auto_model_class)
    if spec.classifier_head:
        with _seeded(_TINY_WEIGHTS_SEED):  # the classifier head is new: make it the same in every process
            model = auto_class.from_pretrained(name, num_labels=num_labels)
    else:
        model = auto_class.from_pretrained(name)
    return LoadedModel(model.eval(), tokenizer, spec.family)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Fork the torch RNG with a fixed seed, leaving the caller's RNG stream untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
