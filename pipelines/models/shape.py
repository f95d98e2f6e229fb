"""Base models by name, read without loading weights: the built-in names, and each model's shape from its config.

Shapes come from config.json read as JSON, so configuration validation imports no torch or transformers;
`read_model_config` builds the transformers config, for the callers that build models from it.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.models.tiny import TINY_MODELS

if TYPE_CHECKING:
    from capt.arch import ArchSpec

BUILTIN_MODELS = (*TINY_MODELS, "minilm", "smollm2-135m")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


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
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
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
    from pipelines.models.smollm2 import ModelSourceError

    try:
        from capt.arch import spec_for_model_type, supported_model_types

        fields = read_config_fields(name)
        model_type = fields.get("model_type")
        if (spec := spec_for_model_type(model_type)) is None:  # a problem when `capt` cannot host its model type
            return (f"model.name={name!r} has model_type={model_type!r}; supported model types: "
                    f"{', '.join(supported_model_types())}")
        return ModelShape(model_type, spec.family, spec, spec.layers_in_config(fields), spec.position_limit(fields))
    except ModelSourceError as err:
        return str(err)
    except ImportError as err:
        return f"model.name={name!r}: {err}"
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = " ".join(str(err).split())
        return (f"model.name={name!r}: cannot read its config.json ({reason}). Check the name, or download it "
                f"while online (`hf download {name} config.json`), or for a gated model accept its licence and "
                "set HF_TOKEN")


def read_config_fields(name: str) -> dict[str, Any]:
    """The fields of model `name`'s config.json, read as JSON (no torch, no transformers): built for tiny models,
    from the converted checkpoint or GGUF metadata for smollm2-135m, from the folder of minilm or of a local model,
    from the Hugging Face cache for a hub id, and from the hub (config.json only) when it is not cached and
    HF_HUB_OFFLINE is not set."""
    if name in TINY_MODELS:
        from pipelines.models import tiny as tiny_models

        return tiny_models.config_fields(name, *_tiny_vocabulary())
    if name == "smollm2-135m":
        from pipelines.models import smollm2

        return smollm2.read_config_fields()
    path = _config_json_path(name)
    fields = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(fields, dict):
        raise ValueError(f"{path} holds a {type(fields).__name__}, not a JSON object")
    return fields


def _config_json_path(name: str) -> Path:
    """config.json of minilm's or a local model's folder, or of hub id `name` in the cache (downloaded first when
    missing)."""
    if name == "minilm":
        from capt.tasks.tokenizers import minilm_model_path

        return Path(minilm_model_path()) / "config.json"
    from huggingface_hub import hf_hub_download

    if Path(name).expanduser().exists():
        return Path(name).expanduser() / "config.json"
    try:
        return Path(hf_hub_download(name, "config.json", local_files_only=True))
    except OSError:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise
        return Path(hf_hub_download(name, "config.json"))


def _tiny_vocabulary() -> tuple[int, dict[str, int]]:
    """Vocabulary size and special-token ids of the tiny models' test tokenizer (what a job on them uses)."""
    from capt.tasks.tokenizers import SPECIAL_TOKENS, TEST_VOCAB_SIZE

    ids = {f"{token}_token_id": SPECIAL_TOKENS.index(text)
           for token, text in (("pad", "<pad>"), ("eos", "</s>"), ("bos", "<s>"))}
    return TEST_VOCAB_SIZE, ids


def read_model_config(name: str):
    """The transformers config of `name`, from the config.json `read_config_fields` reads (the GGUF file's own
    metadata for smollm2-135m without a converted checkpoint)."""
    if name in TINY_MODELS:
        from pipelines.models import tiny as tiny_models

        return tiny_models.config(name, *_tiny_vocabulary())
    if name == "smollm2-135m":
        from pipelines.models import smollm2

        return smollm2.read_config()
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(_config_json_path(name).parent)
