"""The dataset card a job's result carries and its run logs as an MLflow dataset input."""

from __future__ import annotations

import json

from capt import tasks
from pipelines.config.schema import TaskSection
from pipelines.tracking.operations import dataset_entity
from pipelines.training.result import content_digest, dataset_card


def _splits(seed: int) -> tasks.Splits:
    return tasks.load_splits("rte", tasks.DataConfig(source="generated", generated_size=24, seed=seed))


def test_a_card_says_generated_sizes_digest_and_sample_rows_and_becomes_an_mlflow_dataset() -> None:
    splits = _splits(0)
    card = dataset_card(TaskSection(name="rte", source="generated"), splits)
    assert card["name"] == "rte-generated" and card["generated"] is True and card["sizes"] == splits.sizes()
    assert card["digest"] == content_digest(_splits(0)) != content_digest(_splits(1)), "equal data, equal digest"
    assert len(card["sample_rows"]) == 3 and {"premise", "hypothesis", "label"} <= set(card["sample_rows"][0])
    assert card["sample_rows"][0]["label"] in tasks.get("rte").label_names
    dataset = dataset_entity(json.loads(json.dumps(card)))  # as result.json holds it
    assert (dataset.name, dataset.digest, dataset.source_type) == ("rte-generated", card["digest"], "code")
    assert json.loads(dataset.profile)["sizes"] == splits.sizes()
    assert {c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]} >= {"premise", "hypothesis"}
    assert card["warnings"] == []


def test_a_training_split_of_one_label_is_a_warning_on_the_card() -> None:
    splits = _splits(0)
    one_label = tasks.Splits(train=[e for e in splits.train if e.label == 0], validation=splits.validation,
                             test=splits.test)
    card = dataset_card(TaskSection(name="rte", source="generated"), one_label)
    assert len(card["warnings"]) == 1 and "has label 0: the model can only learn to give that answer" in \
        card["warnings"][0]
