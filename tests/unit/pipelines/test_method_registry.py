"""A method is its config class, its model class and one registry entry: registered from outside the code base,
it validates, resolves its own optimiser default and trains, with nothing in the pipelines naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from capt.baselines.config import PromptTuningConfig
from capt.config import CapsuleConfig
from capt.methods import METHODS, OPTIM_DEFAULTS, Method, registered_method
from capt.optim_defaults import OptimDefault
from pipelines.config import load_job_config
from pipelines.config.load import allowed_readouts
from pipelines.config.sources import PipelineConfigError
from pipelines.models.shape import model_shape
from pipelines.training.loop import run

TOY_SOURCE = "toy: an lr no shipped method declares, so finding it in result.json proves where it came from"


@dataclass(frozen=True)
class ToyPromptConfig(PromptTuningConfig):
    """Prompt tuning under a name of its own, with optimiser defaults of its own."""

    method: ClassVar[str] = "toy_prompt"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 0.0625, TOY_SOURCE),
        "decoder": OptimDefault("adamw", 0.0125, TOY_SOURCE),
        "encoder": OptimDefault("adamw", 0.025, TOY_SOURCE),
    }


@dataclass(frozen=True)
class T5OnlyConfig(PromptTuningConfig):
    """A method that declares a default for T5 models alone."""

    method: ClassVar[str] = "t5_only"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {"t5": OptimDefault("adamw", 0.0625, TOY_SOURCE)}


@dataclass(frozen=True)
class UndeclaredConfig(PromptTuningConfig):
    """A method that declares no defaults (its parent's are prompt tuning's, not its own)."""

    method: ClassVar[str] = "undeclared"


@dataclass(frozen=True)
class ToyCapsuleConfig(CapsuleConfig):
    """A capsule under a name of its own: it inherits the capsule slot."""

    optim_defaults: ClassVar[dict[str, OptimDefault]] = ToyPromptConfig.optim_defaults


PROMPT_MODEL = "capt.baselines.prompt:PromptTuningModel"
TINY_JOB = ["task.name=rte", "task.source=generated", "task.generated_size=16", "task.max_eval_examples=8",
            "model.max_length=96", "train.batch_size=16", "train.eval_batch_size=8", "train.eval_mode=rank"]
SHORT_PROMPT = "method.options.num_tokens=2"


def job(model: str, method: str, *overrides: str):
    """A tiny RTE job's config on generated data, through the one entry every job takes."""
    return load_job_config(None, [*TINY_JOB, f"model.name={model}", f"method.name={method}", *overrides])


def test_a_method_registered_from_outside_trains_with_the_lr_it_declares(tmp_path):
    output = tmp_path / "job"
    with registered_method("toy_prompt", Method(ToyPromptConfig, PROMPT_MODEL)):
        config = job("tiny-t5", "toy_prompt", SHORT_PROMPT, "train.max_steps=3", f"output_dir={output}")
        assert (config.optim.name, config.optim.lr) == ("adamw", 0.0625)
        assert OPTIM_DEFAULTS[("toy_prompt", "t5")].source == TOY_SOURCE
        result = run(config)
    assert "toy_prompt" not in METHODS and ("toy_prompt", "t5") not in OPTIM_DEFAULTS
    saved = json.loads((output / "result.json").read_text())
    assert saved["config"]["method"]["name"] == "toy_prompt" and saved["config"]["optim"]["lr"] == 0.0625
    assert saved["optimizer"] == result["optimizer"]
    assert saved["optimizer"]["default"] == {"name": "adamw", "lr": 0.0625, "source": TOY_SOURCE}
    assert [group["lr"] for group in saved["optimizer"]["groups"]] == [0.0625], "the optimiser ran at that lr"
    assert saved["optimizer"]["total_steps"] == 3


def test_a_method_without_a_default_for_the_models_family_is_refused_naming_both():
    with registered_method("t5_only", Method(T5OnlyConfig, PROMPT_MODEL)):
        assert job("tiny-t5", "t5_only", SHORT_PROMPT).optim.lr == 0.0625
        with pytest.raises(PipelineConfigError) as err:
            job("tiny-bert", "t5_only", SHORT_PROMPT)
        explicit = job("tiny-bert", "t5_only", SHORT_PROMPT, "optim.name=adamw", "optim.lr=0.01")
    message = str(err.value)
    assert "'t5_only'" in message and "'encoder'" in message and "set optim.name and optim.lr" in message
    assert (explicit.optim.name, explicit.optim.lr) == ("adamw", 0.01), "the refusal's advice is a way out"


def test_a_method_borrows_no_defaults_from_the_config_class_it_extends():
    with registered_method("undeclared", Method(UndeclaredConfig, PROMPT_MODEL)), \
            pytest.raises(PipelineConfigError, match="'undeclared' on model family 't5'.*set optim.name and optim.lr"):
        job("tiny-t5", "undeclared", SHORT_PROMPT)


def test_a_default_for_an_unknown_family_is_refused_when_the_method_is_built():
    @dataclass(frozen=True)
    class MisspeltConfig(PromptTuningConfig):
        optim_defaults: ClassVar[dict[str, OptimDefault]] = {"bert": OptimDefault("adamw", 0.1, TOY_SOURCE)}

    with pytest.raises(ValueError, match=r"MisspeltConfig\.optim_defaults.*unknown keys: \['bert'\]"):
        Method(MisspeltConfig, PROMPT_MODEL)


def test_the_capsule_readout_asks_the_registry_which_methods_have_a_slot():
    encoder = model_shape("tiny-bert").spec
    assert "capsule" not in allowed_readouts(encoder, "toy_capsule")
    with registered_method("toy_capsule", Method(ToyCapsuleConfig, "capt.inject:CapsuleModel")):
        assert "capsule" in allowed_readouts(encoder, "toy_capsule")
        config = job("tiny-bert", "toy_capsule", "model.readout=capsule")
        assert config.model.readout == "capsule" and config.optim.lr == 0.025
        with pytest.raises(PipelineConfigError,
                           match=r"method 'lora' has no capsule slot \(only capt, toy_capsule have"):
            job("tiny-bert", "lora", "model.readout=capsule")


def test_registering_refuses_a_taken_name_and_always_leaves_the_registry_as_it_was():
    before = dict(METHODS)
    toy = Method(ToyPromptConfig, PROMPT_MODEL)
    with pytest.raises(ValueError, match="'lora' is already registered"), registered_method("lora", toy):
        pass
    with pytest.raises(RuntimeError, match="inside"), registered_method("toy_prompt", toy):
        assert METHODS["toy_prompt"].config_class is ToyPromptConfig
        raise RuntimeError("inside the block")
    assert before == METHODS
