"""Config text is plain YAML: no tag that builds bytes, pairs, sets or dates; no nesting past MAX_NESTING."""

from __future__ import annotations

import pytest

from pipelines.config.load import load_job_config
from pipelines.config.sources import MAX_NESTING, PipelineConfigError, plain_yaml_problem


@pytest.mark.parametrize("text", ["a: 1\nb: [x, {c: null}]\n", "a: !!str 5\n", "a: !!int '5'\nb: !!float 1\n",
                                  "a: 2024-01-01\n", "a: '!!binary aGVsbG8='\n", "a: {b: [1, 2]}\n"])
def test_plain_yaml_passes(text):
    assert plain_yaml_problem(text) is None


@pytest.mark.parametrize(("text", "tag"), [
    ("a: !!binary aGVsbG8=\n", "!!binary"),
    ("a: !!omap [x: 1]\n", "!!omap"),
    ("a:\n  - !!set {x}\n", "!!set"),
    ("a: !!timestamp 2001-12-14\n", "!!timestamp"),
    ("a: !custom x\n", "!custom"),
    ("a: !!python/name:os.system\n", "!!python/name:os.system"),
])
def test_a_tag_that_builds_a_non_plain_value_is_named_with_its_line(text, tag):
    problem = plain_yaml_problem(text)
    assert problem.startswith(f"line {text.count(chr(10), 0, text.index('!')) + 1}: the tag {tag!r}"), problem


def test_nesting_is_allowed_up_to_the_limit_and_refused_past_it():
    assert plain_yaml_problem("a: " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)) is None
    problem = plain_yaml_problem("a:\n  b: " + "[" * MAX_NESTING + "]" * MAX_NESTING)
    assert problem.startswith("line 2: mappings and lists nest more than 32 levels deep"), problem


def test_syntax_errors_are_left_to_the_loader_that_names_them():
    assert plain_yaml_problem("a: [\n") is None
    with pytest.raises(PipelineConfigError, match="is not valid YAML"):
        load_job_config(None, ["task.source=generated", "train.max_steps=[1,"])


def test_a_huge_override_is_refused_without_echoing_all_of_it():
    override = "train.max_steps=" + "[" * 20_000 + "]" * 20_000
    with pytest.raises(PipelineConfigError) as err:
        load_job_config(None, [override])
    assert "nest more than 32 levels deep" in str(err.value) and "(40016 characters)" in str(err.value)
    assert len(str(err.value)) < 400


def test_a_grid_beyond_omegaconfs_node_limit_is_called_too_large_not_invalid(tmp_path):
    """10,000 seeds are valid YAML: the refusal says the text holds more values than a config may, not "quote it"."""
    from pipelines.sweeps.config import load_sweep_config

    seeds = "[" + ",".join(map(str, range(10_001))) + "]"
    path = tmp_path / "big.yaml"
    path.write_text(f"tasks: [rte]\nmodels: [tiny-t5]\nseeds: {seeds}\n")
    for refused in (lambda: load_sweep_config(None, [f"seeds={seeds}"]), lambda: load_sweep_config(path)):
        with pytest.raises(PipelineConfigError) as caught:
            refused()
        message = str(caught.value)
        assert "more values than one config may" in message and "at most 10,000" in message, message[-500:]
        assert "quote it" not in message and "not valid YAML" not in message
