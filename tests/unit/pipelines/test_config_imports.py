"""Loading and validating job and sweep configs imports no torch or transformers: a fresh process validates jobs on
every kind of model source (built-in tiny models, MiniLM's folder, a local folder, the hub cache, SmolLM2's converted
checkpoint or its GGUF file) and a sweep's trials, takes the sweep driver's closing steps (the champions to promote,
the registry line it prints), then lists what of torch and transformers it imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.hub_cache import write_hub_cache

from capt.digest import file_sha256
from pipelines.models import smollm2

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers")
JOB = "pipelines/configs/job/smoke.yaml"
SWEEP = "pipelines/configs/smoke.yaml"
_VALIDATE = f"""
import json, sys
from pipelines.config.load import load_job_config
from pipelines.sweeps.config import load_sweep_config, trials

from pipelines.sweep import registry_line, serve_lines
from pipelines.sweeps.run import champion_pairs

for model in sys.argv[1:]:
    load_job_config({JOB!r}, [f"model.name={{model}}"])
sweep = load_sweep_config({SWEEP!r})
assert trials(sweep)
done = [{{"model": "minilm", "task": "cb", "method": "capt", "status": "done"}}]
assert champion_pairs(sweep, done) == [("minilm", "cb")]
assert "capt-minilm-cb@champion" in registry_line("capt-minilm-cb", "http://127.0.0.1:5000", stopped=True)
assert serve_lines(sweep, ["capt-" + sweep.models[0] + "-" + sweep.tasks[0]], "http://127.0.0.1:5000", True)
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""
# SmolLM2's published config.json fields that validation reads, as its conversion writes them.
SMOLLM2_CONFIG = {"model_type": "llama", "num_hidden_layers": 30, "max_position_embeddings": 8192}


def _imported_after_validating(models: list[str], env: dict[str, str]) -> list[str]:
    """What of `HEAVY` a fresh process has imported after validating a job on each of `models` and a sweep."""
    done = subprocess.run([sys.executable, "-c", _VALIDATE, *models], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _converted_smollm2(cache: Path) -> None:
    """A converted SmolLM2 checkpoint folder in model cache `cache` as validation reads it: config.json and the
    manifest of its digest (the weights, which validation never reads, left out)."""
    folder = cache / smollm2.checkpoint_dir().relative_to(smollm2.cache_root())
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    manifest = {"files": {"config.json": file_sha256(folder / "config.json")}}
    (folder / smollm2.MANIFEST).write_text(json.dumps(manifest))


def test_validating_jobs_and_a_sweep_imports_no_torch(tmp_path):
    local = tmp_path / "local-t5"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"model_type": "t5", "num_layers": 3}))
    _converted_smollm2(tmp_path / "models")
    env = {"HF_HUB_CACHE": str(write_hub_cache(tmp_path / "hub")), "HF_HUB_OFFLINE": "1",
           smollm2.CACHE_ENV: str(tmp_path / "models")}
    models = ["tiny-t5", "tiny-llama", "tiny-qwen2", "tiny-bert", "minilm", smollm2.NAME, str(local),
              "meta-llama/Llama-3.2-1B"]
    assert _imported_after_validating(models, env) == []


@pytest.mark.slow  # reading the GGUF file's metadata takes a few seconds on 2 CPUs
def test_validating_a_job_on_unconverted_smollm2_imports_no_torch(tmp_path):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip(f"the gguf package is not installed ({smollm2.INSTALL})")
    try:
        smollm2.gguf_path()
    except smollm2.ModelSourceError as err:
        pytest.skip(str(err))
    assert _imported_after_validating([smollm2.NAME], {smollm2.CACHE_ENV: str(tmp_path)}) == []
