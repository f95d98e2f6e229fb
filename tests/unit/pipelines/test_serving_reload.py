"""The engine's side of a registry poll, without Ray: a new task joins a running bank and answers as its pyfunc
predictor, a retired task is refused but comes back, a capsule of another base model is refused while the bank
keeps answering as before; the replica's route checks follow each change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.asgi import respond
from helpers.registry import train_capsule

from capt.errors import CapsuleArtifactError
from capt.tasks import example_rows
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.serving.app import CapsuleServer
from pipelines.serving.engine import CapsuleEngine, ServedCapsule


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("reload-jobs")
    return {"rte": train_capsule(out / "rte", "rte", 0, max_epochs=1),
            "cb": train_capsule(out / "cb", "cb", 0, max_epochs=1),
            "copa-llama": train_capsule(out / "copa", "copa", 0, model="tiny-llama", max_epochs=1)}


def _served(result: dict[str, Any], version: int = 1) -> ServedCapsule:
    return ServedCapsule(result["task"], result["task"], f"capt-tiny-t5-{result['task']}", version,
                         Path(result["artifact_dir"]), result)


def _labels(engine: CapsuleEngine, task: str, rows: list[dict[str, Any]]) -> list[str]:
    return engine.answer([(task, engine.examples(task, rows))])[0].labels


def test_a_new_task_joins_the_bank_and_a_retired_one_comes_back(jobs: dict[str, dict[str, Any]]) -> None:
    engine = CapsuleEngine([_served(jobs["rte"])])
    rows = {task: example_rows(task, 4) for task in ("rte", "cb")}
    before = _labels(engine, "rte", rows["rte"])
    engine.add(_served(jobs["cb"]))
    assert engine.names == ["rte", "cb"] and engine.versions() == {"rte": 1, "cb": 1}
    mixed = engine.answer([(t, engine.examples(t, rows[t])) for t in ("cb", "rte")])
    assert [a.labels for a in mixed] == [CapsulePredictor(jobs["cb"]["artifact_dir"], jobs["cb"]).predict_rows(
        rows["cb"]), before]
    assert (mixed[0].model_name, mixed[0].version) == ("capt-tiny-t5-cb", 1)
    engine.retire("cb")
    assert engine.names == ["rte"] and engine.versions() == {"rte": 1}
    assert _labels(engine, "cb", rows["cb"])  # a request accepted before the retirement still gets its answer
    engine.add(_served(jobs["cb"], version=2))
    assert engine.versions() == {"rte": 1, "cb": 2}


def test_a_capsule_of_another_base_model_is_refused_and_the_bank_is_unchanged(
        jobs: dict[str, dict[str, Any]]) -> None:
    engine = CapsuleEngine([_served(jobs["rte"])])
    rows = example_rows("rte", 3)
    before = _labels(engine, "rte", rows)
    with pytest.raises(CapsuleArtifactError, match="tiny-llama"):
        engine.add(_served(jobs["copa-llama"]))
    assert engine.names == ["rte"] and _labels(engine, "rte", rows) == before


def _post(server: CapsuleServer, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """`body` POSTed to the replica's routes in process (answers stubbed: the checks are what is tested here)."""
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data))}
    return respond(server, "POST", "/", headers, [data])[:2]


def test_the_route_checks_follow_a_hot_add_a_swap_and_a_drop(jobs: dict[str, dict[str, Any]]) -> None:
    server = CapsuleServer({"model": "tiny-t5", "tasks": ["rte"], "tracking_uri": "unused", "auth": False},
                           [_served(jobs["rte"])])

    async def checked(name: str, examples: list[Any]) -> dict[str, Any]:
        return {"task": name}

    server.answer = checked
    cb, rte = ({"task": task, "inputs": example_rows(task, 1)} for task in ("cb", "rte"))
    assert _post(server, rte) == (200, {"task": "rte"})
    status, body = _post(server, cb)
    assert (status, body["rule"]) == (400, "served_task") and body["error"].endswith("tasks served: rte."), body
    server.engine.add(_served(jobs["cb"]))
    assert _post(server, cb) == (200, {"task": "cb"})
    assert _post(server, {"task": "cb"})[1]["error"].startswith("The field 'inputs' is missing; send {\"task\": one "
                                                                "of ['rte', 'cb'],")
    longer = {**jobs["rte"], "config": {**jobs["rte"]["config"], "model": {
        **jobs["rte"]["config"]["model"], "max_length": 4 * jobs["rte"]["config"]["model"]["max_length"]}}}
    before = server.catalog().limits.max_chars
    server.engine.add(_served(longer, version=2))  # a swap may change the largest character limit
    assert server.catalog().limits.max_chars == 4 * before == server.max_chars("rte")
    server.engine.retire("rte")
    status, body = _post(server, rte)
    assert (status, body["field"]) == (400, "task") and body["error"].endswith("tasks served: cb."), body
    assert server.catalog().limits.max_chars == server.max_chars("cb") == before


def test_a_refused_start_and_a_stopped_replica_leave_no_download_folder(jobs: dict[str, dict[str, Any]],
                                                                        tmp_path: Path, monkeypatch) -> None:
    """The replica downloads registry versions into a folder of its own: removed when its start is refused (no such
    capsule registered) and when Serve stops it (`__del__`)."""
    import tempfile

    from pipelines.serving.source import ServeError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = {"model": "tiny-t5", "tasks": ["rte"], "tracking_uri": f"sqlite:///{tmp_path / 'empty.db'}",
                "auth": False}
    with pytest.raises(ServeError, match="no capsule of this base model is registered"):
        CapsuleServer(settings)
    assert not list(tmp_path.glob("capt-serve-*"))
    server = CapsuleServer({**settings, "tracking_uri": "unused"}, [_served(jobs["rte"])])
    server.source = type("Source", (), {"root": tempfile.mkdtemp(prefix="capt-serve-")})()
    server.__del__()
    assert not list(tmp_path.glob("capt-serve-*"))
