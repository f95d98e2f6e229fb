"""Base models and tokenizers by name: built-in offline models, the MiniLM package, or Hugging Face checkpoints."""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capt.arch import ArchSpec, spec_for, spec_for_model_type, supported_model_types

logger = logging.getLogger(__name__)

TINY_MODELS = ("tiny-t5", "tiny-llama", "tiny-qwen2", "tiny-bert")
BUILTIN_MODELS = (*TINY_MODELS, "minilm")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
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


def model_name_problems(name: str) -> list[str]:
    """Why `name` cannot be loaded, checked without loading anything (empty when fine)."""
    if name in BUILTIN_MODELS:
        return []
    path = Path(name).expanduser()
    if path.exists():
        return [] if (path / "config.json").is_file() else [f"model.name={name!r}: {path} has no config.json"]
    if not _HUB_ID.match(name):
        return [f"model.name={name!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), an existing "
                "directory, or a hub id like 'google-t5/t5-base'"]
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not _in_hub_cache(name):
        return [f"model.name={name!r}: not in the local Hugging Face cache and HF_HUB_OFFLINE=1 (built-in "
                f"offline models: {', '.join(BUILTIN_MODELS)})"]
    return []


@dataclass(frozen=True)
class ModelShape:
    """What pre-flight validation needs of a base model, read from its config alone (no weights loaded)."""

    model_type: str
    """`config.model_type`."""
    family: str
    """"t5", "decoder" or "encoder"."""
    spec: ArchSpec
    """The `capt.arch` spec of its family: every family-dependent behaviour is a property of it."""
    capsule_layers: int
    """Depth of the layer stack that hosts capsules (T5: the encoder)."""
    position_limit: int | None
    """Longest input sequence the model has positions for (None: no hard limit, e.g. T5)."""


def model_shape(name: str) -> ModelShape:
    """The shape of model `name` from its config; raises ValueError naming `model.name` when it cannot be read."""
    shape = _shape_or_problem(name)
    if isinstance(shape, str):
        raise ValueError(shape)
    return shape


def forget_model_shapes() -> None:
    """Drop the cached shapes (after the hub cache or a local model folder changed)."""
    _shape_or_problem.cache_clear()


@functools.lru_cache(maxsize=64)
def _shape_or_problem(name: str) -> ModelShape | str:
    """Cached, failures included: a sweep validates every trial of a model, one config read (or hub call) each."""
    try:
        config = read_model_config(name)
    except ImportError as err:
        return f"model.name={name!r}: {err}"
    except (OSError, ValueError, KeyError) as err:
        reason = " ".join(str(err).split())
        return (f"model.name={name!r}: cannot read its config.json ({reason}). Check the name, or download it "
                f"while online (`hf download {name} config.json`), or for a gated model accept its licence and "
                "set HF_TOKEN")
    spec = spec_for_model_type(config.model_type)
    if spec is None:
        return (f"model.name={name!r} has model_type={config.model_type!r}; supported model types: "
                f"{', '.join(supported_model_types())}")
    return ModelShape(config.model_type, spec.family, spec, spec.layers_in_config(config), spec.position_limit(config))


def read_model_config(name: str):
    """The transformers config of `name`: built for tiny models, from the cache or a local folder for the
    rest, and from the hub (config.json only) when it is not cached and HF_HUB_OFFLINE is not set."""
    from transformers import AutoConfig

    if name in TINY_MODELS:
        from capt.tasks.tokenizers import SPECIAL_TOKENS, TEST_VOCAB_SIZE
        from pipelines import tiny_models

        ids = {f"{token}_token_id": SPECIAL_TOKENS.index(text)
               for token, text in (("pad", "<pad>"), ("eos", "</s>"), ("bos", "<s>"))}
        return tiny_models.config(name, TEST_VOCAB_SIZE, ids)
    if name == "minilm":
        from capt.tasks.tokenizers import minilm_model_path

        return AutoConfig.from_pretrained(minilm_model_path())
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except OSError:
        if Path(name).expanduser().exists() or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise
        return AutoConfig.from_pretrained(name)


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def load_model(name: str, num_labels: int, dtype: str = "float32") -> LoadedModel:
    """Load (or build) the base model `name`; encoder-only models get a `num_labels`-way linear head."""
    torch_dtype = getattr(torch, dtype)
    if name in TINY_MODELS:
        loaded = _tiny(name, num_labels)
    elif name == "minilm":
        loaded = _minilm(num_labels)
    else:
        loaded = _pretrained(name, num_labels)
    loaded.model.to(torch_dtype)
    return loaded


def _tiny(name: str, num_labels: int) -> LoadedModel:
    from capt.tasks import test_tokenizer
    from pipelines import tiny_models

    family = {"tiny-t5": "t5", "tiny-bert": "encoder"}.get(name, "decoder")
    tokenizer = test_tokenizer(family)
    with _seeded(_TINY_WEIGHTS_SEED):
        model = tiny_models.build(name, tokenizer, num_labels)
    model.config._name_or_path = name
    return LoadedModel(model.eval(), tokenizer, family)


def _minilm(num_labels: int) -> LoadedModel:
    from transformers import AutoTokenizer, BertForSequenceClassification

    from capt.tasks.tokenizers import minilm_model_path

    path = minilm_model_path()
    with _seeded(_TINY_WEIGHTS_SEED):  # the classifier head is new: make it the same in every process
        model = BertForSequenceClassification.from_pretrained(path, num_labels=num_labels)
    model.config._name_or_path = "minilm"
    return LoadedModel(model.eval(), AutoTokenizer.from_pretrained(path), "encoder")


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


class _seeded:
    """Fork the torch RNG with a fixed seed, leaving the caller's RNG stream untouched."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc) -> None:
        self._fork.__exit__(*exc)
