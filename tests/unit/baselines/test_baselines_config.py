"""Config validation lists every problem; family detection names the supported types."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from capt.baselines import (
    METHODS,
    FullFinetuneConfig,
    LoraConfig,
    PromptTuningConfig,
    PTuningV2Config,
    apply,
    detect_family,
)
from capt.baselines.adapter.config import AdapterConfig
from capt.baselines.dept.config import DeptConfig
from capt.baselines.ept.config import EPTConfig
from capt.baselines.residual_prompt.config import ResidualPromptConfig
from capt.baselines.smop.config import SMoPConfig
from capt.baselines.superpos_prompt.config import SuperPosPromptConfig
from capt.baselines.vfpt.config import VfptConfig

from .baselines_helpers import build


def test_methods_map_names_to_config_classes() -> None:
    from capt.baselines.xprompt.config import XPromptConfig

    assert {"prompt_tuning": PromptTuningConfig, "ptuning_v2": PTuningV2Config,
                       "lora": LoraConfig, "full_finetune": FullFinetuneConfig,
                       "adapter": AdapterConfig,
                       "dept": DeptConfig,
                       "residual_prompt": ResidualPromptConfig,
                       "superpos_prompt": SuperPosPromptConfig,
                       "vfpt": VfptConfig,
                       "smop": SMoPConfig, "ept": EPTConfig,
                       "xprompt": XPromptConfig} == METHODS
    for name, cls in METHODS.items():
        assert cls.method == name
        assert cls.from_dict(cls().to_dict()) == cls()


def test_defaults() -> None:
    assert PromptTuningConfig().num_tokens == 100 and PromptTuningConfig().init == "normal"
    assert PTuningV2Config().num_tokens == 20 and not PTuningV2Config().reparameterize
    assert PTuningV2Config().reparam_hidden == 512 and PTuningV2Config().dropout == 0.0
    assert (LoraConfig().r, LoraConfig().alpha, LoraConfig().target_modules) == (8, 16, None)


@pytest.mark.parametrize(
    ("cls", "kwargs", "expected"),
    [
        (PromptTuningConfig, {"num_tokens": 0, "init": "zeros", "init_std": -1.0, "instance_token": "yes"},
         ["num_tokens=0", "init='zeros'", "init_std=-1.0", "instance_token='yes'", "'normal' or 'vocab'"]),
        (PTuningV2Config, {"num_tokens": 2.5, "reparameterize": 1, "reparam_hidden": 0, "dropout": 1.0,
                           "init_std": float("nan")},
         ["num_tokens=2.5", "reparameterize=1", "reparam_hidden=0", "dropout=1.0", "init_std=nan"]),
        (LoraConfig, {"r": True, "alpha": 0, "dropout": -0.1, "target_modules": []},
         ["r=True", "alpha=0", "dropout=-0.1", "target_modules=[]", "integer >= 1"]),
        (LoraConfig, {"target_modules": ["q", ""]}, ["target_modules=['q', '']"]),
    ],
)
def test_bad_configs_list_every_problem(cls: type, kwargs: dict, expected: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    message = str(info.value)
    assert cls.__name__ in message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


def test_from_dict_lists_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['depth', 'prefix'\].*allowed: \['r', 'alpha'"):
        LoraConfig.from_dict({"r": 4, "prefix": 1, "depth": 2})
    with pytest.raises(ValueError, match="unknown keys"):
        FullFinetuneConfig.from_dict({"lr": 1})


def test_configs_are_frozen() -> None:
    config = PTuningV2Config()
    with pytest.raises(AttributeError):
        config.num_tokens = 3  # type: ignore[misc]


def test_family_detection() -> None:
    assert [detect_family(build(k)) for k in ("t5", "llama", "qwen2", "bert")] == [
        "t5", "decoder", "decoder", "encoder"]
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'.*supported: bert, gemma"):
        apply(gpt2, PTuningV2Config())


def test_apply_rejects_unknown_config() -> None:
    with pytest.raises(TypeError, match="unknown baseline config"):
        apply(build("llama"), object())  # type: ignore[arg-type]
