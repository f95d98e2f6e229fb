"""Small options per method for the tests that train every method (tiny models, a few steps)."""

from __future__ import annotations

from typing import Any

OPTIONS: dict[str, dict[str, Any]] = {
    "prompt_tuning": {"num_tokens": 4},
    "ptuning_v2": {"num_tokens": 4},
    "lora": {"r": 4},
    "adapter": {"bottleneck": 8},
    "dept": {"num_tokens": 4, "rank": 4, "max_length": 96},
    "residual_prompt": {"num_tokens": 4, "bottleneck": 16},
    "superpos_prompt": {"num_tokens": 4, "num_sampled": 32},
    "vfpt": {"num_tokens": 4},
    "smop": {"num_tokens": 4, "num_prompts": 2},
    "ept": {"num_tokens": 4, "rank": 4, "max_length": 96, "num_spaces": 2, "space_rank": 2},
    "xprompt": {"num_tokens": 4, "pieces": 4, "token_prune_fraction": 0.25, "piece_prune_fraction": 0.25,
                "pruning_at": 0.3},
}
"""Method -> options (CaPT and full fine-tuning take their defaults)."""


def options(method: str) -> dict[str, Any]:
    """A copy of `method`'s small options."""
    return dict(OPTIONS.get(method, {}))
