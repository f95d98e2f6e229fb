"""Config validation (CapsuleConfig, the baselines' and the task data's): one error naming every bad key,
the value and what is allowed, in one format."""

from __future__ import annotations

import pytest

import capt
from capt.baselines import LoraConfig
from capt.errors import ConfigError
from capt.tasks import DataConfig


def test_defaults_are_the_papers():
    config = capt.CapsuleConfig()
    assert (config.layers, config.fusion, config.init, config.instance_mean, config.task_vector, config.length) == (
        "all", "add", "zeros", True, True, 1)


def test_every_bad_key_is_reported_at_once():
    with pytest.raises(capt.CapsuleConfigError) as err:
        capt.CapsuleConfig(layers="even", fusion="glue", init="xavier", init_std=-1.0, length=0, instance_mean="yes",
                           project_rank=0)
    message = str(err.value)
    for fragment in ("layers='even'", "first_half", "fusion='glue'", "add, project, prepend, conv",
                     "init='xavier'", "zeros, normal", "init_std=-1.0", "length=0", "instance_mean='yes'",
                     "project_rank=0"):
        assert fragment in message


@pytest.mark.parametrize("options, fragment", [
    (dict(instance_mean=False, task_vector=False), "at least one of them"),
    (dict(task_vector=False, fusion="project"), "instance-only anchor has no weights"),
    (dict(instance_mean=False, fusion="conv"), "no mean to fuse"),
    (dict(layers=[]), "non-empty list"),
    (dict(layers=[0, -1]), "non-negative"),
])
def test_meaningless_combinations_are_refused(options, fragment):
    with pytest.raises(capt.CapsuleConfigError, match=fragment):
        capt.CapsuleConfig(**options)


def test_layer_presets_resolve():
    assert capt.CapsuleConfig(layers="odd").resolve_layers(5) == (0, 2, 4)
    assert capt.CapsuleConfig(layers="first_half").resolve_layers(24) == tuple(range(12))
    assert capt.CapsuleConfig(layers=[3, 1, 3]).resolve_layers(4) == (1, 3)
    with pytest.raises(capt.CapsuleConfigError, match=r"names layers \[7\] but the model has 4 layers"):
        capt.CapsuleConfig(layers=[1, 7]).resolve_layers(4)


def test_dict_round_trip_and_unknown_keys():
    config = capt.CapsuleConfig(layers=[0, 2], fusion="conv", length=2)
    assert capt.CapsuleConfig.from_dict(config.to_dict()) == config
    with pytest.raises(capt.CapsuleConfigError, match=r"Invalid CapsuleConfig: unknown keys \['depth'\]"):
        capt.CapsuleConfig.from_dict({"depth": 3})


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: capt.CapsuleConfig(length=0, fusion="mul"),
     "Invalid CapsuleConfig: fusion='mul' (allowed: add, project, prepend, conv); length=0 (allowed: an int >= 1)."),
    (lambda: LoraConfig(r=0, dropout=1.0),
     "Invalid LoraConfig: r=0 (allowed: integer >= 1); dropout=1.0 (allowed: number in [0, 1))."),
    (lambda: LoraConfig.from_dict({"rank": 4}),
     "Invalid LoraConfig: unknown keys ['rank'] (allowed: ['r', 'alpha', 'dropout', 'target_modules'])."),
    (lambda: DataConfig(source="web", generated_size=0),
     "Invalid DataConfig: source='web' (allowed: hub, local, generated); generated_size=0 (allowed: a positive int)."),
], ids=["capsule", "baseline", "baseline-keys", "task-data"])
def test_every_config_reports_its_problems_in_one_format(build, expected):
    with pytest.raises(ConfigError) as raised:
        build()
    assert isinstance(raised.value, capt.CaptError) and isinstance(raised.value, ValueError)
    assert str(raised.value) == expected
