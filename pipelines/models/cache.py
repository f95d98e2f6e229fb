"""Frozen base models kept between the jobs of one process (a reused Tune trial process), checked after each job.

Loading a base model is a fixed cost of every trial (seconds to minutes for real checkpoints); a sweep trains many jobs
on the same few base models. `BaseModelCache.lease` hands a job the cached model when it has one and takes it back
afterwards only if the model is exactly as loaded: the method detached (see `pipelines.training.loop.run`), every
parameter and buffer bit-identical to the load (a CRC-32 of every tensor's bytes, about 3 GB/s on one core, plus the
module tree, names, shapes and dtypes). Otherwise the entry is dropped and the next job loads afresh.
What may be cached and why:
- capt, prompt_tuning, ptuning_v2, lora freeze the base model and attach to it (hooks, an attention route,
  PEFT layers injected into it); each wrapper's `detach()` removes all of it, which the check confirms.
- adapter trains the base model's layer norms beside its adapters; its `detach()` writes their loaded values back.
- full_finetune trains the base weights themselves: it bypasses the cache (a fresh load, never stored).
- Encoder classifiers (BERT family) have a task head inside the base model that every method trains. The entry
  keeps the head as loaded (the seeded initialisation a fresh load gives for this `num_labels`) and copies it back
  after every job, before the check; a trained head never reaches the next job. What the head reads (a readout,
  `capt.arch.readout`) is a forward hook the job removes; one left behind changes the fingerprint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from capt.arch import head_parameters
from pipelines.models import smollm2
from pipelines.models.loading import LoadedModel, load_model
from pipelines.models.shape import read_model_config
from pipelines.models.tiny import TINY_MODELS

logger = logging.getLogger(__name__)

TRAINS_BASE_WEIGHTS = ("full_finetune",)
"""Methods that train the base model's own weights: never served from (or stored in) the cache."""
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model")


@dataclass
class _Entry:
    loaded: LoadedModel
    fingerprint: str
    requires_grad: dict[str, bool]
    head: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class BaseModelCache:
    """Base models by (name, dtype, labels of an encoder head, source fingerprint); one job holds an entry at a time."""

    loads: int = 0
    """Base models this cache loaded (cache misses and bypasses), for tests and logs."""
    hits: int = 0
    """Jobs served a cached model."""
    _entries: dict[tuple, _Entry] = field(default_factory=dict)

    @contextlib.contextmanager
    def lease(self, name: str, num_labels: int, dtype: str, method: str) -> Iterator[LoadedModel]:
        """The base model for one job; kept for the next job only if the job ends normally and leaves it untouched."""
        if method in TRAINS_BASE_WEIGHTS:
            self.loads += 1
            yield load_model(name, num_labels, dtype)
            return
        key = (name, dtype, num_labels, source_fingerprint(name))
        entry = self._entries.pop(key, None)  # out of the cache while a job holds it
        if entry is None:
            self.loads += 1
            loaded = load_model(name, num_labels, dtype)
            params, head = dict(loaded.model.named_parameters()), {id(p) for p in head_parameters(loaded.model)}
            entry = _Entry(loaded, weights_fingerprint(loaded.model), {n: p.requires_grad for n, p in params.items()},
                           {n: p.detach().clone() for n, p in params.items() if id(p) in head})
        else:
            self.hits += 1
            logger.info("Base model %s (%s) from this process's cache: no weights loaded", name, dtype)
        yield entry.loaded  # an exception (a failed or stopped job) drops the entry: its state is unknown
        if _restored_and_unchanged(entry):
            self._entries[key] = entry
        else:
            logger.warning("The cached base model %s changed during the job: dropped, the next job loads it again",
                           name)

    def __len__(self) -> int:
        return len(self._entries)


BASE_MODELS = BaseModelCache()
"""This process's cache (a Tune trial process reused between trials keeps it)."""


def _restored_and_unchanged(entry: _Entry) -> bool:
    """Put back what every job legitimately changes (mode, grad flags, grads, the head); True if the rest is as
    loaded."""
    model = entry.loaded.model
    model.eval()
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, initial in entry.head.items():
            if name in named:
                named[name].copy_(initial.to(named[name].device))
    for name, param in named.items():
        param.grad = None
        param.requires_grad_(entry.requires_grad.get(name, param.requires_grad))
    return weights_fingerprint(model) == entry.fingerprint


def weights_fingerprint(model: nn.Module) -> str:
    """The module tree (names, classes and forward hook counts), every parameter and buffer (name, shape, dtype) and
    a CRC-32 of its bytes.

    Any changed bit of any tensor, and any module or forward hook a method (or a readout) left behind, changes the
    result.
    """
    structure = hashlib.sha256()
    for name, module in model.named_modules():
        hooks = len(module._forward_hooks) + len(module._forward_pre_hooks)
        structure.update(f"{name}={type(module).__name__}:{hooks};".encode())
    crc = 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        structure.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        crc = zlib.crc32(data.numpy(), crc)
    return f"{structure.hexdigest()[:16]}:{crc:08x}"


def source_fingerprint(name: str) -> str:
    """What identifies the weights `name` loads: tiny models' config, a snapshot's commit, files' sizes and times."""
    if name in TINY_MODELS:
        return hashlib.sha256(read_model_config(name).to_json_string().encode()).hexdigest()[:16]
    folder = _local_folder(name)
    if folder is None:
        return "unresolved"
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    stats = [(str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps([str(folder.resolve()), stats]).encode()).hexdigest()[:16]


def _local_folder(name: str) -> Path | None:
    """The folder the weights of `name` load from: MiniLM's package, a local folder, or the hub cache's snapshot."""
    if name == "minilm":
        from capt.tasks.tokenizers import minilm_model_path

        return Path(minilm_model_path())
    if name == smollm2.NAME:
        folder = smollm2.checkpoint_dir()
        return folder if folder.is_dir() else None
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(name, "config.json")
    return Path(config).parent if isinstance(config, str) else None
