"""A Hugging Face hub cache holding only the config.json of the paper's models, as `hf download MODEL config.json`
would leave it: pre-flight validation reads layer counts and position limits from it offline, no weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Published config.json fields that pre-flight validation reads (the rest take transformers' defaults).
PAPER_CONFIGS: dict[str, dict] = {
    "google-t5/t5-base": {"model_type": "t5", "d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12,
                          "num_layers": 12, "vocab_size": 32128, "n_positions": 512},
    "google-t5/t5-large": {"model_type": "t5", "d_model": 1024, "d_ff": 4096, "d_kv": 64, "num_heads": 16,
                           "num_layers": 24, "vocab_size": 32128, "n_positions": 512},
    "meta-llama/Llama-3.2-1B": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                                "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                "head_dim": 64, "max_position_embeddings": 131072, "vocab_size": 128256},
    "Qwen/Qwen2.5-1.5B": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
                          "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                          "max_position_embeddings": 131072, "vocab_size": 151936},
}
_COMMIT = "0" * 40


def write_hub_cache(root: Path, configs: dict[str, dict] = PAPER_CONFIGS) -> Path:
    """Lay out `configs` under `root` in the hub cache format (refs/main -> snapshots/<commit>/config.json)."""
    for repo_id, config in configs.items():
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(_COMMIT)
        snapshot = repo / "snapshots" / _COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
    return root


def use_hub_cache(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point this process (and its subprocesses, via HF_HUB_CACHE) at a cache of the paper models' configs, offline."""
    from huggingface_hub import constants

    from pipelines.models.shape import forget_model_shapes

    write_hub_cache(root)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))  # read at call time by transformers and the hub
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    forget_model_shapes()
    return root
