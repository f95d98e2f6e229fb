"""Encoder-only capsules served (issue 35 item 1), without Ray: tiny-bert capsules of tasks with 2, 3 and 5
labels, each with its own head and readout, answer in one mixed batch exactly as each task's predictor alone;
a swap brings its head along; a head that is not one linear layer is refused with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.jobs import tiny_job
from torch import nn

from capt import heads as heads_module
from capt.errors import CapsuleArtifactError
from capt.heads import TaskHead, TaskHeads, linear_head, linear_head_problem
from capt.tasks import example_rows
from pipelines.adapted import _to
from pipelines.capsule_predictor import CapsulePredictor, validated_examples
from pipelines.serving.engine import CapsuleEngine, ServedCapsule
from pipelines.training.loop import run

ATOL = 1e-5
"""fp32: the mixed batch pads rows to a longer width and applies the heads with bmm instead of a linear."""
JOBS = {"rte": ("capsule", 0), "cb": ("mean", 0), "csqa": ("pooler", 0), "rte1": ("cls", 1)}
"""name -> (readout, seed); rte has 2 labels, cb 3, csqa 5."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("encoder-jobs")
    found = {}
    for name, (readout, seed) in JOBS.items():
        config = tiny_job(out / name, "tiny-bert", "capt", f"seed={seed}", f"model.readout={readout}",
                          task={"name": name.rstrip("1")}, train={"max_steps": 3, "eval_every_steps": 3})
        found[name] = run(config)
    return found


def _served(result: dict[str, Any], version: int = 1, **changes: Any) -> ServedCapsule:
    fields = {"name": result["task"], "task": result["task"], "model_name": f"capt-tiny-bert-{result['task']}",
              "version": version, "capsule_dir": Path(result["artifact_dir"]), "result": result, **changes}
    return ServedCapsule(**fields)


def _alone(result: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list[str], torch.Tensor]:
    """What the task's single-task predictor (the registry pyfunc's) answers: labels and log-softmax scores."""
    predictor = CapsulePredictor(result["artifact_dir"], result)
    batch = predictor.collator(validated_examples(result["task"], rows))
    with torch.no_grad():
        logits = predictor.model(**_to(batch, predictor.device)).logits
    return predictor.predict_rows(rows), torch.log_softmax(logits.float(), dim=-1)


def test_a_mixed_batch_of_three_label_counts_answers_as_each_task_alone(jobs: dict[str, Any]) -> None:
    engine = CapsuleEngine([_served(jobs[name]) for name in ("rte", "cb", "csqa")])
    assert engine.bank.heads.label_counts == [2, 3, 5]
    rows = {task: example_rows(task, 5) for task in ("rte", "cb", "csqa")}
    requests = [("cb", rows["cb"][:2]), ("rte", rows["rte"]), ("csqa", rows["csqa"]), ("cb", rows["cb"][2:])]
    answers = engine.answer([(name, engine.examples(name, part)) for name, part in requests])
    worst = 0.0
    for task in ("rte", "cb", "csqa"):
        labels, scores = _alone(jobs[task], rows[task])
        mine = [a for (name, _), a in zip(requests, answers, strict=True) if name == task]
        assert [label for a in mine for label in a.labels] == labels
        served = torch.tensor([row for a in mine for row in a.scores])
        assert served.shape == scores.shape
        worst = max(worst, (served - scores).abs().max().item())
    assert worst <= ATOL, f"largest score difference {worst:.2e}"
    assert [len(s[0]) for s in (answers[0].scores, answers[1].scores, answers[2].scores)] == [3, 2, 5]


def test_a_task_added_while_serving_brings_its_head_and_answers_as_alone(jobs: dict[str, Any]) -> None:
    engine = CapsuleEngine([_served(jobs["rte"]), _served(jobs["cb"])])
    engine.add(_served(jobs["csqa"]))
    assert engine.bank.names == ["rte", "cb", "csqa"] and engine.bank.heads.label_counts == [2, 3, 5]
    rows = {task: example_rows(task, 4) for task in ("csqa", "rte")}
    answers = engine.answer([(task, engine.examples(task, part)) for task, part in rows.items()])
    for task, answer in zip(rows, answers, strict=True):
        labels, scores = _alone(jobs[task], rows[task])
        assert answer.labels == labels
        assert torch.allclose(torch.tensor(answer.scores), scores, atol=ATOL)


def test_a_swap_brings_its_own_head_and_readout(jobs: dict[str, Any]) -> None:
    engine = CapsuleEngine([_served(jobs["rte"]), _served(jobs["cb"])])
    rows = example_rows("rte", 4)
    engine.add(_served(jobs["rte1"], version=2))
    assert engine.versions() == {"rte": 2, "cb": 1} and engine.bank.heads.readouts[0] == "cls"
    (answer,) = engine.answer([("rte", engine.examples("rte", rows))])
    labels, scores = _alone(jobs["rte1"], rows)
    assert answer.version == 2 and answer.labels == labels
    assert torch.allclose(torch.tensor(answer.scores), scores, atol=ATOL)


def test_the_head_is_searched_once_per_base_model_however_many_capsules_load(jobs: dict[str, Any],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[nn.Module] = []
    search = heads_module._search_linear_head
    monkeypatch.setattr(heads_module, "_search_linear_head", lambda model: searched.append(model) or search(model))
    engine = CapsuleEngine([_served(jobs[task], name=f"{task}-{i}") for i in range(3) for task in ("rte", "cb")])
    engine.add(_served(jobs["csqa"]))
    engine.add(_served(jobs["rte1"], name="rte-0", version=2))
    assert searched == [engine.bank.base_model]  # 8 capsules and their heads read, one search
    assert engine.bank.heads.label_counts == [2, 3] * 3 + [5] and engine.bank.heads.readouts[0] == "cls"


def test_heads_that_do_not_fit_are_refused() -> None:
    heads = TaskHeads([TaskHead(torch.zeros(2, 8), torch.zeros(2), "mean")], hidden_size=8)
    with pytest.raises(CapsuleArtifactError, match=r"does not fit this encoder: it needs \(labels, 8\)"):
        heads.replace(0, TaskHead(torch.zeros(3, 16), torch.zeros(3), "mean"))
    with pytest.raises(CapsuleArtifactError, match="'lm_head' is not a readout"):
        TaskHeads([TaskHead(torch.zeros(2, 8), None, "lm_head")], hidden_size=8)


def test_a_head_that_is_not_one_linear_layer_is_named() -> None:
    from pipelines.models.loading import load_model

    model = load_model("tiny-bert", 2).model
    assert linear_head_problem(model) is None and linear_head(model) is model.classifier
    model.classifier = nn.Linear(model.config.hidden_size, 3)  # a new head is found, not the one found before
    assert linear_head(model) is model.classifier and linear_head(model).out_features == 3
    model.classifier = nn.Sequential(nn.Linear(model.config.hidden_size, 4), nn.Tanh(), nn.Linear(4, 2))
    assert "not one linear layer over the pooled vector" in linear_head_problem(model)


def test_the_driver_names_an_unservable_base_model_before_deploying(tmp_path: Path) -> None:
    from transformers import RobertaConfig

    from pipelines.serve import refuse_unservable, servable_problem
    from pipelines.serving.source import RegistrySource, ServeError

    assert servable_problem("tiny-bert") is None and servable_problem("tiny-t5") is None
    roberta = tmp_path / "tiny-roberta"
    RobertaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=32).save_pretrained(roberta)
    assert "RobertaForSequenceClassification" in servable_problem(str(roberta))
    source = RegistrySource("http://127.0.0.1:9", str(roberta), "champion", tmp_path)
    with pytest.raises(ServeError, match=r"cannot be served: RobertaForSequenceClassification .* not one linear"):
        refuse_unservable(source, {})
