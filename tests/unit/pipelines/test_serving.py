"""The serving engine without Ray: one mixed batch answers as each task's pyfunc predictor, a capsule swaps
in place, capsules of another base model are refused; the Serve config file and settings (encoder-only capsules:
test_serving_encoder.py)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.registry import train_capsule
from ray.serve.schema import ServeDeploySchema

from capt.errors import CapsuleArtifactError
from capt.tasks import TaskDataError, example_rows
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.config.sources import PipelineConfigError
from pipelines.serving.app import build
from pipelines.serving.auth import TOKEN_ENV, digest
from pipelines.serving.engine import CapsuleEngine, ServedCapsule
from pipelines.serving.settings import ServeSettings
from pipelines.serving.source import ServeError

SERVE_CONFIG = Path(__file__).resolve().parents[3] / "infra" / "serve.yaml"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("serving-jobs")
    return {f"{task}{seed}": train_capsule(out / f"{task}{seed}", task, seed, max_epochs=1)
            for task, seed in (("rte", 0), ("cb", 0), ("rte", 1))}


def _served(result: dict[str, Any], version: int = 1, **changes: Any) -> ServedCapsule:
    fields = {"name": result["task"], "task": result["task"], "model_name": f"capt-tiny-t5-{result['task']}",
              "version": version, "capsule_dir": Path(result["artifact_dir"]), "result": result, **changes}
    return ServedCapsule(**fields)


def test_one_mixed_batch_answers_as_each_task_alone_and_a_swap_takes_effect(jobs: dict[str, Any]) -> None:
    engine = CapsuleEngine([_served(jobs["rte0"]), _served(jobs["cb0"])])
    rows = {task: example_rows(task, 5) for task in ("rte", "cb")}
    requests = [("rte", rows["rte"][:2]), ("cb", rows["cb"]), ("rte", rows["rte"][2:])]
    answers = engine.answer([(name, engine.examples(name, part)) for name, part in requests])
    for task in ("rte", "cb"):
        alone = CapsulePredictor(jobs[f"{task}0"]["artifact_dir"], jobs[f"{task}0"]).predict_rows(rows[task])
        assert [label for (name, _), a in zip(requests, answers, strict=True) if name == task
                for label in a.labels] == alone
    assert [len(s) for s in answers[1].scores] == [3] * 5 and answers[1].version == 1

    before = [p.detach().clone() for p in engine.bank.capsules[0].parameters()]
    engine.add(_served(jobs["rte1"], version=2))
    assert engine.versions() == {"rte": 2, "cb": 1}
    after = engine.answer([("rte", engine.examples("rte", rows["rte"]))])[0]
    assert after.version == 2
    assert after.labels == CapsulePredictor(jobs["rte1"]["artifact_dir"], jobs["rte1"]).predict_rows(rows["rte"])
    assert any(not p.equal(q) for p, q in zip(before, engine.bank.capsules[0].parameters(), strict=True))


class _Result(dict):
    """A job result that a weak reference can watch."""


def test_the_engine_keeps_a_record_of_each_capsule_not_its_job_result(jobs: dict[str, Any]) -> None:
    results = {task: _Result(jobs[f"{task}0"]) for task in ("rte", "cb")}
    watched = [weakref.ref(results["rte"]), weakref.ref(results["cb"])]
    engine = CapsuleEngine([_served(results["rte"], digest="ab" * 32)])
    engine.add(_served(results["cb"]))
    del results
    gc.collect()
    assert [ref() for ref in watched] == [None, None]  # a parsed result.json is ~16 KB; a 1,000-capsule bank kept 1,000
    record = engine.served("rte")
    assert (record.task, record.model_name, record.version, record.digest) == ("rte", "capt-tiny-t5-rte", 1, "ab" * 32)
    assert engine.served("cb").mode == jobs["cb0"]["config"]["train"]["eval_mode"]
    engine.add(_served(jobs["rte1"], version=2))  # its record changes at its own bank index, cb's stays
    assert [(r.task, r.version, r.digest) for r in map(engine.served, ("rte", "cb"))] == [("rte", 2, None),
                                                                                          ("cb", 1, None)]
    assert engine.names == ["rte", "cb"] and len(engine.records) == 2


def test_capsules_given_one_at_a_time_are_each_dropped_before_the_next_is_read(jobs: dict[str, Any]) -> None:
    """As a replica fetches registry versions: a generator's capsules (and their ~16 KB results) are not all held
    at once while the bank loads."""
    given: list[weakref.ref] = []
    live_when_asked: list[int] = []

    def fetched():
        for name, key in (("rte", "rte0"), ("cb", "cb0"), ("rte-b", "rte1")):
            gc.collect()
            live_when_asked.append(sum(ref() is not None for ref in given))
            result = _Result(jobs[key])
            given.append(weakref.ref(result))
            yield _served(result, name=name)

    engine = CapsuleEngine(fetched())
    assert engine.names == ["rte", "cb", "rte-b"] and max(live_when_asked) <= 1
    gc.collect()
    assert all(ref() is None for ref in given)


def test_rows_are_checked_with_the_pyfunc_errors(jobs: dict[str, Any]) -> None:
    engine = CapsuleEngine([_served(jobs["rte0"])])
    with pytest.raises(TaskDataError, match="row 1: field 'hypothesis': missing field"):
        engine.examples("rte", [{"premise": "A cat sat."}])


def test_capsules_of_another_base_model_are_refused(jobs: dict[str, Any]) -> None:
    other = {**jobs["cb0"], "model": "tiny-llama"}
    with pytest.raises(CapsuleArtifactError, match="trained on base model 'tiny-llama', not on 'tiny-t5'"):
        CapsuleEngine([_served(jobs["rte0"]), _served(other)])
    engine = CapsuleEngine([_served(jobs["rte0"])])
    with pytest.raises(CapsuleArtifactError, match="trained on base model 'tiny-llama'"):
        engine.add(_served(other, name="rte"))
    assert engine.versions() == {"rte": 1}


def test_the_serve_config_file_is_valid_and_builds_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    assert app["import_path"] == "pipelines.serving.app:build"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.internal.example")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ServeError, match=f"needs a bearer token: set {TOKEN_ENV}"):
        build(app["args"])
    monkeypatch.setenv(TOKEN_ENV, "a-token-of-the-cluster-0123456789")
    assert build(app["args"]) is not None
    assert build({**app["args"], "auth": False}) is not None
    settings = ServeSettings.from_args({**app["args"], "tracking_uri": "https://mlflow.internal.example",
                                        "token_sha256": digest("a-token-of-the-cluster-0123456789")})
    assert settings.num_gpus == 1 and settings.alias == "champion" and settings.max_body_bytes == 2**20


def test_bad_serve_settings_name_the_key() -> None:
    with pytest.raises(PipelineConfigError, match="auth is on but no token_sha256"):
        ServeSettings.from_args({"model": "t5-base", "tasks": ["rte"], "tracking_uri": "http://x"})
    with pytest.raises(PipelineConfigError, match=r"poll_s: .*greater than 0 \(given -1\)"):
        ServeSettings.from_args({"model": "t5-base", "tasks": ["rte"], "tracking_uri": "http://x", "poll_s": -1,
                                 "auth": False})
    with pytest.raises(PipelineConfigError, match=r"poll_s: .*finite"):  # inf would never poll again
        ServeSettings.from_args({"model": "t5-base", "tasks": ["rte"], "tracking_uri": "http://x",
                                 "poll_s": float("inf"), "auth": False})
    with pytest.raises(PipelineConfigError, match="Allowed keys: model, tasks"):
        ServeSettings.from_args({"model": "t5-base", "tasks": ["rte"], "tracking_uri": "http://x", "polls": 3})
