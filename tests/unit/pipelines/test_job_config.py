"""Job configs: YAML + overrides, and every problem reported at once before any model loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.bad_inputs import call_entry

from capt.config import CapsuleConfig
from pipelines.config.load import load_job_config
from pipelines.config.schema import flatten, model_slug
from pipelines.config.sources import PipelineConfigError
from pipelines.training.outputs import config_hash

ROOT = Path(__file__).resolve().parents[3]
JOB_CONFIGS = sorted((ROOT / "pipelines" / "configs" / "job").glob("*.yaml"))


@pytest.mark.parametrize("path", JOB_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_job_config_parses_and_names_its_command(path):
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# python -m pipelines.train --config pipelines/configs/job/")
    assert first_line.endswith(path.name)
    load_job_config(path)


def test_overrides_win_and_are_typed(tmp_path):
    config = load_job_config(JOB_CONFIGS[0], ["train.batch_size=4", "method.options.layers=[0]", "seed=3",
                                              "task.source=generated"])
    assert config.train.batch_size == 4 and config.seed == 3
    assert config.method.options == {**CapsuleConfig().to_dict(), "layers": [0]}, "the method's defaults written out"
    assert flatten(config.to_dict())["train.batch_size"] == 4


def test_the_method_defaults_are_part_of_the_resolved_config_and_its_hash():
    """A job that leaves a method option out and one that gives its default share one hash; the option's value is
    in the resolved config (so a changed default changes the hash), and a different value changes it."""
    given = ["task.source=generated", "method.name=prompt_tuning"]
    omitted = load_job_config(JOB_CONFIGS[0], given)
    explicit = load_job_config(JOB_CONFIGS[0], [*given, "method.options.num_tokens=100"])
    other = load_job_config(JOB_CONFIGS[0], [*given, "method.options.num_tokens=20"])
    assert omitted.method.options["num_tokens"] == 100 and omitted.method.options["init"] == "normal"
    assert config_hash(omitted) == config_hash(explicit) != config_hash(other)


def test_every_problem_is_listed_at_once():
    with pytest.raises(PipelineConfigError) as err:
        load_job_config(None, ["method.name=dora", "task.name=squad", "train.batch_size=-2", "train.warp=9",
                               "model.dtype=int3", "task.source=generated"])
    message = str(err.value)
    assert "5 problems" in message
    for fragment in ("method.name='dora'", "'capt'", "task.name='squad'", "'rte'", "train.batch_size=-2",
                     "greater than 0", "train.warp: unknown key", "model.dtype='int3'"):
        assert fragment in message


def test_an_option_of_another_method_is_refused():
    with pytest.raises(PipelineConfigError, match=r"method.options for method 'lora'.*num_tokens"):
        load_job_config(None, ["method.name=lora", "method.options.num_tokens=20", "task.source=generated"])
    with pytest.raises(PipelineConfigError, match=r"method.options for method 'capt'.*fusion='glue'"):
        load_job_config(None, ["method.options.fusion=glue", "task.source=generated"])


def test_unknown_model_and_missing_data_dir(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    with pytest.raises(PipelineConfigError) as err:
        load_job_config(None, ["model.name=nobody/no-such-model", "task.source=local"])
    message = str(err.value)
    assert "model.name='nobody/no-such-model'" in message and "not in the local Hugging Face cache" in message
    assert "CAPT_DATA_DIR" in message


def test_cli_fails_before_loading_a_model(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method:\n  name: capt\n  options: {length: 0}\ntrain:\n  batch_size: 0\n")
    proc = call_entry("train", ["--config", str(bad), "task.source=generated", f"output_dir={tmp_path / 'out'}"],
                      dict(os.environ), tmp_path, capsys)
    assert proc.returncode == 2
    assert "length=0" in proc.stderr and "train.batch_size=0" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_model_slug():
    assert model_slug("google-t5/t5-base") == "t5-base"
    assert model_slug("meta-llama/Llama-3.2-1B") == "llama-3.2-1b"
    assert model_slug("/data/my model/") == "my-model"


def _problems(*overrides: str) -> str:
    with pytest.raises(PipelineConfigError) as err:
        load_job_config(None, [*overrides, "task.source=generated"])
    return str(err.value)


def _local_model(tmp_path, config: str) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    return str(folder)


def test_capsule_layers_the_model_lacks_are_refused():
    message = _problems("model.name=tiny-t5", "method.options.layers=[0,2,7]")
    assert ("method.options.layers=[0, 2, 7]: model.name='tiny-t5' has 2 encoder layers, so [2, 7] do not exist"
            in message)
    assert "allowed: indices 0..1" in message
    assert "has 6 layers" in _problems("model.name=minilm", "method.options.layers=[6]")
    load_job_config(None, ["model.name=minilm", "method.options.layers=[5]", "task.source=generated"])


def test_max_length_beyond_the_position_limit_is_refused_with_the_numbers():
    message = _problems("model.name=minilm", "model.max_length=600")
    assert "model.max_length=600: model.name='minilm' has positions for 512 tokens" in message
    assert "allowed: at most 512" in message
    load_job_config(None, ["model.name=minilm", "model.max_length=512", "task.source=generated"])
    # Decoder-only generation appends max_new_tokens positions after the input.
    message = _problems("model.name=tiny-llama", "model.max_length=1020", "model.max_new_tokens=10")
    assert "model.max_length=1020 + model.max_new_tokens=10 generated after it" in message and "at most 1014" in message
    load_job_config(None, ["model.name=tiny-llama", "model.max_length=1020", "train.eval_mode=rank",
                           "task.source=generated"])
    # Relative positions: T5 takes any length.
    load_job_config(None, ["model.name=tiny-t5", "model.max_length=4096", "task.source=generated"])


def test_a_method_that_leaves_no_room_for_text_is_refused():
    message = _problems("method.name=prompt_tuning", "method.options.num_tokens=100", "model.max_length=100")
    assert "model.max_length=100: method 'prompt_tuning' adds 100 positions" in message


def test_a_local_model_is_checked_from_its_config(tmp_path):
    gpt2 = _local_model(tmp_path, '{"model_type": "gpt2", "n_layer": 2}')
    message = _problems(f"model.name={gpt2}")
    assert f"model.name={gpt2!r} has model_type='gpt2'; supported model types:" in message and "'t5'" not in message
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert f"model.name={str(broken)!r}: cannot read its config.json" in _problems(f"model.name={broken}")


def test_baselines_refuse_a_model_type_only_capsules_support(tmp_path):
    umt5 = _local_model(tmp_path, '{"model_type": "umt5", "num_layers": 4, "d_model": 32}')
    message = _problems(f"model.name={umt5}", "method.name=prompt_tuning", "method.options.num_tokens=4")
    assert "the baselines do not support model_type='umt5'" in message
    assert "has 4 encoder layers" in _problems(f"model.name={umt5}", "method.options.layers=[4]")


def test_cli_refuses_missing_capsule_layers_before_loading_a_model(tmp_path, capsys):
    proc = call_entry("train", ["--config", str(JOB_CONFIGS[0]), "task.source=generated", "model.name=tiny-t5",
                                "method.options.layers=[3]", f"output_dir={tmp_path / 'out'}"],
                      dict(os.environ), tmp_path, capsys)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "has 2 encoder layers, so [3] do not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_task_section_builds_the_data_config_from_every_field(monkeypatch):
    from pipelines.config.schema import TaskSection

    section = TaskSection(name="cb", source="generated", data_dir="/data", validation_fraction=0.2,
                          max_train_examples=7, max_eval_examples=5, generated_size=30)
    data = section.data_config(seed=4)
    assert (data.source, data.data_dir, data.seed, data.validation_fraction, data.max_train_examples,
            data.max_eval_examples, data.generated_size) == ("generated", "/data", 4, 0.2, 7, 5, 30)
    monkeypatch.setenv("CAPT_DATA_DIR", "/from-env")
    assert TaskSection().data_config(seed=0).data_dir == "/from-env"
