"""Sweep configs: every shipped YAML parses, grids expand to valid jobs, problems are listed at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.hub_cache import use_hub_cache

from pipelines.config.load import validate_job_config
from pipelines.config.sources import PipelineConfigError
from pipelines.sweeps.config import load_sweep_config, trials
from pipelines.sweeps.run import max_concurrent, sweep_folder_problems
from pipelines.training.outputs import config_hash

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "pipelines" / "configs"
SWEEPS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "job")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """One hub cache and data dir for the module: a shipped sweep loads alike in every test (`shipped`)."""
    return tmp_path_factory.mktemp("sweep-config")


@pytest.fixture(autouse=True)
def _paper_models_cached(monkeypatch, data_dir):
    # Paper configs name hub checkpoints: validation reads their config.json (layers, positions) from the cache.
    use_hub_cache(data_dir / "hub", monkeypatch)
    monkeypatch.setenv("CAPT_DATA_DIR", str(data_dir))  # configs that read local data need a data dir


@pytest.fixture(scope="module")
def shipped():
    """`shipped(path)`: the shipped sweep at `path`, loaded as it ships, and its trials; each loaded once for the
    tests that only read them (a paper grid's 777 trials take seconds to build and validate)."""
    loaded: dict[Path, tuple] = {}

    def load(path: Path) -> tuple:
        if path not in loaded:
            sweep = load_sweep_config(path)
            loaded[path] = sweep, trials(sweep)
        return loaded[path]

    return load


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(CONFIGS)))
@pytest.mark.slow
def test_every_shipped_sweep_parses_and_names_its_command(path, shipped):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and f"--config pipelines/configs/{path.relative_to(CONFIGS)}" in first
    assert "pipelines/sweep.py" in first
    assert shipped(path)[1]


@pytest.mark.parametrize("name", ["t5-base", "t5-large", "llama-3.2-1b", "qwen2.5-1.5b"])
@pytest.mark.slow
def test_paper_grids_are_seven_tasks_every_method_three_seeds(name, shipped):
    from pipelines.config.schema import METHOD_NAMES

    sweep, points = shipped(CONFIGS / "paper" / f"{name}.yaml")
    # XPrompt selects its two pruning ratios on validation, 5 x 5 candidate pairs: 25 trials per task and seed.
    assert len(points) == 7 * (len(METHOD_NAMES) + 24) * 3
    assert {p.method for p in points} == set(METHOD_NAMES), "CaPT and all twelve baselines of the paper's table"
    first = {p.method: p.job for p in points}
    assert first["dept"]["method"]["options"] == {"num_tokens": 60, "rank": 30, "max_length": 256,
                                                  "embedding_lr": 0.0005, "init": "text"}
    assert (first["smop"]["optim"]["name"], first["smop"]["optim"]["lr"]) == ("adafactor", 0.5)
    assert first["adapter"]["method"]["options"]["bottleneck"] == 24
    assert (first["residual_prompt"]["optim"]["name"], first["residual_prompt"]["optim"]["lr"]) == ("adamw", 0.3)
    boolq = next(p for p in points if p.task == "boolq")
    assert boolq.job["task"]["source"] == "hub", "BoolQ's train split comes from the hub"
    lora = next(p for p in points if p.method == "lora")
    assert lora.job["optim"]["name"] == "adamw" and lora.job["method"]["options"]["r"] == 8
    assert sweep.resources.gpus_per_worker >= 1


@pytest.mark.slow
def test_ablations_cover_every_row_of_the_table(shipped):
    points = shipped(CONFIGS / "ablations.yaml")[1]
    options = {p.method: p.job["method"]["options"] for p in points}
    assert {o.get("layers") for o in options.values()} >= {"all", "first_half", "odd"}
    assert {o.get("fusion") for o in options.values()} >= {"project", "prepend", "conv"}
    assert any(o.get("task_vector") is False for o in options.values())
    assert any(o.get("instance_mean") is False for o in options.values())
    assert any(o.get("length", 1) > 1 for o in options.values())
    assert any(o.get("instance_token") for o in options.values())
    assert any(o.get("instance_tokens") for o in options.values()), "P-Tuning v2 + training-free instance token"
    from pipelines.config.schema import METHOD_NAMES

    assert {p.job["method"]["name"] for p in points} == set(METHOD_NAMES), "CaPT beside all twelve baselines"
    assert {p.model for p in points if p.method.startswith("capt-length")} == {"meta-llama/Llama-3.2-1B"}


def test_a_bad_sweep_lists_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [rte, squad]\nmethods: [{name: capt, options: {fusion: glue}}]\n"
                   "resources: {num_workers: 0}\n")
    with pytest.raises(PipelineConfigError) as err:
        load_sweep_config(bad)
    message = str(err.value)  # a section the schema refuses does not hide the trials' own problems
    assert "resources.num_workers=0" in message and "task.name='squad'" in message and "fusion='glue'" in message
    bad.write_text("tasks: [rte, squad]\nmethods: [{name: capt, options: {fusion: glue}}]\n")
    with pytest.raises(PipelineConfigError) as err:
        load_sweep_config(bad, ["data_source=generated"])
    message = str(err.value)
    assert "task.name='squad'" in message and "fusion='glue'" in message
    bad.write_text("tasks: [rte]\nseeds: [0, 1, 2]\nmethods: [{name: capt, options: {fusion: glue}}]\n")
    with pytest.raises(PipelineConfigError) as err:
        load_sweep_config(bad, ["data_source=generated"])
    assert str(err.value).count("fusion='glue'") == 1 and "3 trial(s)" in str(err.value), "reported once"


def test_trial_names_and_output_dirs_are_stable(tmp_path):
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", [f"storage_path={tmp_path}", "data_source=generated"])
    names = [t.name for t in trials(sweep)]
    assert names == ["cb-tiny-t5-capt-s0", "cb-minilm-capt-s0", "rte-tiny-t5-capt-s0", "rte-minilm-capt-s0"]
    first = trials(sweep)[0].job
    digest = config_hash(validate_job_config(first))
    assert first["output_dir"] == str(tmp_path / "smoke" / "jobs" / f"cb-tiny-t5-capt-s0-{digest[:10]}")
    assert [t.job["output_dir"] for t in trials(sweep)] == [t.job["output_dir"] for t in trials(sweep)]
    assert all(t.job["train"]["resume"] for t in trials(sweep))


def test_a_trial_whose_config_changed_gets_its_own_folder(tmp_path):
    base = [f"storage_path={tmp_path}", "data_source=generated"]
    folders = {t.name: t.job["output_dir"] for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", base))}
    changed_job = {t.name: t.job["output_dir"]
                   for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", [*base, "job.optim.weight_decay=0.01"]))}
    assert set(changed_job) == set(folders) and not set(changed_job.values()) & set(folders.values())
    one_task = {t.name: t.job["output_dir"]
                for t in trials(load_sweep_config(CONFIGS / "smoke.yaml",
                                                  [*base, "task_overrides.cb.optim.weight_decay=0.01"]))}
    assert [n for n in folders if one_task[n] != folders[n]] == ["cb-tiny-t5-capt-s0", "cb-minilm-capt-s0"]
    logging_only = {t.name: t.job["output_dir"]
                    for t in trials(load_sweep_config(CONFIGS / "smoke.yaml", [*base, "job.train.log_every_steps=3"]))}
    assert logging_only == folders, "a key that cannot change the result keeps the folder"


def test_concurrency_follows_the_cluster():
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", ["data_source=generated"])
    assert max_concurrent(sweep, {"CPU": 2.0}) == 2, "one CPU a trial: its job runs in the trial process"
    assert max_concurrent(sweep, {"CPU": 16.0}) == 16
    gpu = load_sweep_config(CONFIGS / "paper" / "qwen2.5-1.5b.yaml", ["data_source=generated"])
    assert max_concurrent(gpu, {"CPU": 64.0, "GPU": 8.0}) == 4


def test_relative_paths_are_resolved_on_the_driver(tmp_path, monkeypatch):
    # Tune runs each trial in its own working directory: a relative path there would land in Ray's temp dir.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CAPT_DATA_DIR", "data")
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", ["storage_path=runs", "data_source=generated"])
    assert sweep.storage_path == str(tmp_path / "runs")
    assert trials(sweep)[0].job["output_dir"].startswith(str(tmp_path / "runs" / "smoke" / "jobs"))
    assert os.environ["CAPT_DATA_DIR"] == str(tmp_path / "data")


def test_the_data_source_is_decided_by_the_driver_not_by_a_workers_environment(tmp_path, monkeypatch):
    # A trial rebuilds its job in its worker process; a node with task files must not turn generated data real.
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", [f"storage_path={tmp_path}"])
    assert sweep.data_source == "generated"
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))  # what a worker node may have
    assert {t.job["task"]["source"] for t in trials(sweep)} == {"generated"}
    assert load_sweep_config(CONFIGS / "smoke.yaml", [f"storage_path={tmp_path}"]).data_source == "local"


def _refusal(*overrides: str) -> str:
    with pytest.raises(PipelineConfigError) as err:
        load_sweep_config(CONFIGS / "smoke.yaml", [*overrides, "data_source=generated"])
    return str(err.value)


def test_empty_and_repeated_axes_are_all_refused_at_once():
    message = _refusal("tasks=[]", "models=[]", "methods=[]", "seeds=[0,0]")
    for key in ("tasks=[]: empty", "models=[]: empty", "methods=[]: empty", "seeds=[0, 0]: 0 given more than once"):
        assert key in message
    message = _refusal("tasks=[cb,rte,cb]", "models=[tiny-t5,minilm,tiny-t5]", "seeds=[]")
    assert "tasks=['cb', 'rte', 'cb']: cb given more than once" in message
    assert "models=['tiny-t5', 'minilm', 'tiny-t5']: tiny-t5 given more than once" in message
    assert "seeds=[]: empty" in message


def test_a_refused_sweep_section_and_the_trials_problems_are_reported_together():
    message = _refusal("seeds=[-1]", "tasks=[rtx]", "job.optim.lr=-2", "resources.max_concurrent_trials=0")
    for problem in ("seeds.0=-1: Input should be greater than or equal to 0",
                    "resources.max_concurrent_trials=0", "task.name='rtx'", "optim.lr=-2"):
        assert problem in message, problem
    assert ".." not in message


def test_the_sweep_command_reports_its_folders_with_the_configs_problems():
    for overrides in (["tasks=[rtx]"], ["seeds=[-1]"]):  # beside a trial's problem, and beside a refused section
        with pytest.raises(PipelineConfigError) as err:
            load_sweep_config(CONFIGS / "smoke.yaml", [*overrides, "storage_path=/proc/capt-sweeps",
                                                       "data_source=generated"], more_checks=sweep_folder_problems)
        message = str(err.value)
        assert "storage_path='/proc/capt-sweeps' is on a kernel file system" in message, message
        assert ("task.name='rtx'" if "rtx" in overrides[0] else "seeds.0=-1") in message, message


def test_models_that_share_a_slug_are_refused(tmp_path):
    local = tmp_path / "mirror" / "t5-base"
    local.mkdir(parents=True)
    (local / "config.json").write_text('{"model_type": "t5", "num_layers": 12}')
    message = _refusal(f"models=[google-t5/t5-base,{local}]")
    assert f"models google-t5/t5-base and {local} -> 't5-base'" in message and "share output folders" in message


def test_repeated_method_labels_are_refused():
    message = _refusal("methods=[{name: capt}, {name: capt, options: {layers: odd}}]")
    assert "rows labelled capt repeat" in message


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs", "", "..", "x..y", ".hidden", "a b"])
def test_a_sweep_name_cannot_leave_the_storage_root(name):
    message = _refusal(f"name='{name}'")
    assert f"name={name!r}" in message and "letters, digits, '.', '_' or '-'" in message


@pytest.mark.parametrize("label", ["../../etc", "a/b", "", ".."])
def test_a_method_label_cannot_leave_the_storage_root(label):
    message = _refusal(f"methods=[{{name: capt, label: '{label}'}}]")
    assert f"methods.0.label={label!r}" in message and "'+'" in message


def test_safe_names_and_labels_pass():
    sweep = load_sweep_config(CONFIGS / "smoke.yaml", ["name=my_sweep-2.1", "methods=[{name: capt, label: capt+x_1}]",
                                                        "data_source=generated"])
    assert {t.method for t in trials(sweep)} == {"capt+x_1"}


def test_a_grid_whose_rows_run_on_no_model_is_refused():
    message = _refusal("methods=[{name: capt, models: [google-t5/t5-base]}]")
    assert "the grid is empty" in message


def test_capsule_layers_beyond_the_model_are_refused_before_ray(tmp_path):
    # tiny-t5 has 2 encoder layers, MiniLM 6: layer 4 exists only in MiniLM.
    message = _refusal("methods=[{name: capt, options: {layers: [0, 4]}}]")
    assert "method.options.layers=[0, 4]: model.name='tiny-t5' has 2 encoder layers" in message
    assert "model.name='minilm'" not in message
    paper = load_sweep_config(CONFIGS / "paper" / "t5-base.yaml", ["methods=[{name: capt, options: {layers: [11]}}]"])
    assert trials(paper)
    with pytest.raises(PipelineConfigError, match=r"'google-t5/t5-base' has 12 encoder layers.*0\.\.11"):
        load_sweep_config(CONFIGS / "paper" / "t5-base.yaml", ["methods=[{name: capt, options: {layers: [12]}}]"])


def test_max_length_beyond_minilm_positions_is_refused():
    message = _refusal("models=[minilm]", "job.model.max_length=513")
    assert "model.max_length=513: model.name='minilm' has positions for 512 tokens" in message


def test_resources_are_checked(tmp_path):
    message = _refusal("resources.gpus_per_worker=1.5", "resources.custom_per_worker={GPU: 1}",
                       "resources.pending_timeout_s=-1")
    assert "resources.gpus_per_worker=1.5" in message and "whole number of GPUs" in message
    assert "resources.custom_per_worker={'GPU': 1}: GPU: built into Ray" in message
    assert "resources.pending_timeout_s=-1" in message


def test_a_tracking_uri_with_credentials_is_refused_without_echoing_them():
    from pipelines.sweeps.run import refuse_credentials_in_uri

    refuse_credentials_in_uri("http://127.0.0.1:5000")  # no user info: accepted
    with pytest.raises(PipelineConfigError, match="holds credentials") as caught:
        refuse_credentials_in_uri("https://ann:s3cret@mlflow.example:5443/")
    assert "s3cret" not in str(caught.value) and "mlflow.example:5443" in str(caught.value)


@pytest.mark.parametrize("name", ["t5-base", "t5-large", "llama-3.2-1b", "qwen2.5-1.5b"])
@pytest.mark.slow
def test_paper_presets_run_on_real_data_only(name, monkeypatch, data_dir, shipped):
    path = CONFIGS / "paper" / f"{name}.yaml"
    local = {p.task: p.job["task"] for p in shipped(path)[1]}  # CAPT_DATA_DIR set by the fixture
    chosen = (local["rte"]["source"], local["rte"]["data_dir"], local["boolq"]["source"])
    assert chosen == ("local", str(data_dir), "hub")
    monkeypatch.delenv("CAPT_DATA_DIR")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the hub allowed (the models' configs still come from the cache)
    assert {p.job["task"]["source"] for p in trials(load_sweep_config(path))} == {"hub"}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PipelineConfigError, match="CAPT_DATA_DIR is not set and the hub is off"):
        load_sweep_config(path)
    monkeypatch.setenv("CAPT_DATA_DIR", str(data_dir))
    with pytest.raises(PipelineConfigError, match="set task.source='generated'"):
        load_sweep_config(path, ["task_overrides.cb.task.source=generated"])


def test_a_ray_job_with_a_working_dir_refuses_relative_folders_with_the_flags_to_add(tmp_path, monkeypatch):
    """`ray job submit --working-dir .` runs the sweep in Ray's temporary copy of the folder: relative folders would
    put the results and the MLflow store there. Refused before anything starts; absolute ones (or a server) pass."""
    import json

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_1"}}))
    small = ["models=[tiny-t5]", "tasks=[rte]", "data_source=generated"]
    with pytest.raises(PipelineConfigError) as refused:
        load_sweep_config(CONFIGS / "smoke.yaml", small, more_checks=sweep_folder_problems)
    message = str(refused.value)
    assert "storage_path='outputs/sweeps' is relative" in message and "storage_path=/ABSOLUTE/FOLDER" in message
    assert "tracking.local_dir='outputs/mlflow' is relative" in message and "tracking.uri=http://HOST:PORT" in message
    load_sweep_config(CONFIGS / "smoke.yaml", [*small, f"storage_path={tmp_path / 's'}",
                                               "tracking.uri=http://127.0.0.1:5000"], more_checks=sweep_folder_problems)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}}))  # no working_dir: cwd is yours
    load_sweep_config(CONFIGS / "smoke.yaml", small, more_checks=sweep_folder_problems)


def test_local_data_the_trials_cannot_read_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """A missing task folder or split file: one line per distinct problem, naming the trials it stops."""
    (tmp_path / "cb").mkdir()
    (tmp_path / "cb" / "train.jsonl").write_text("{}\n")
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))
    with pytest.raises(PipelineConfigError) as refused:
        load_sweep_config(CONFIGS / "smoke.yaml", ["models=[tiny-t5]", f"storage_path={tmp_path / 's'}",
                                                   "tracking.enabled=false"], more_checks=sweep_folder_problems)
    message = str(refused.value)
    assert "1 trial(s) (cb-tiny-t5-capt-s0) cannot read their data: " in message and "missing file val.jsonl" in message
    assert "1 trial(s) (rte-tiny-t5-capt-s0) cannot read their data: " in message
    assert "missing task folder 'rte'" in message
    load_sweep_config(CONFIGS / "smoke.yaml", ["models=[tiny-t5]", "tasks=[cb]", "data_source=generated",
                                               f"storage_path={tmp_path / 's'}"], more_checks=sweep_folder_problems)


def test_a_grid_above_the_trial_bound_is_refused_at_once_naming_its_count_the_bound_and_the_split(tmp_path,
                                                                                                   monkeypatch):
    """9,000 seeds are refused before any job config is built (Tune would hold the driver for minutes); the bound
    itself is accepted, search grids and num_samples count too."""
    from pipelines.sweeps import config as sweep_config
    from pipelines.sweeps.config import MAX_TRIALS, tune_trials

    validated = []
    real_validate = sweep_config.validate_job_config
    monkeypatch.setattr(sweep_config, "validate_job_config", lambda job: validated.append(1) or real_validate(job))
    base = ["models=[tiny-t5]", "tasks=[rte]", "data_source=generated", f"storage_path={tmp_path}"]
    with pytest.raises(PipelineConfigError) as caught:
        load_sweep_config(CONFIGS / "smoke.yaml", [*base, f"seeds={list(range(9000))}"])
    message = str(caught.value)
    assert not validated, "refused from the axes' lengths, before any of the 9,000 job configs is validated"
    assert "9,000 trials" in message and f"the {MAX_TRIALS:,} one sweep runs" in message, message
    assert "name=NAME-a" in message and "tracking.experiment=NAME" in message
    accepted = load_sweep_config(CONFIGS / "smoke.yaml", [*base, f"seeds={list(range(MAX_TRIALS))}"])
    assert len(trials(accepted)) == tune_trials(accepted) == MAX_TRIALS
    assert validated, "the accepted grid's jobs are validated (the refusal above had none to validate)"
    searched = [*base, "seeds=[0,1,2,3,4,5,6,7,8,9]", "num_samples=2",
                "search={optim.lr: {grid: " + str([i / 1000 for i in range(1, 77)]) + "}}"]
    with pytest.raises(PipelineConfigError, match="the grid has 1,520 trials"):
        load_sweep_config(CONFIGS / "smoke.yaml", searched)
