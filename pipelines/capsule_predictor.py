"""What a registered capsule does when loaded: rebuild the adapted model and predict label names.

`pipelines.tracking.CapsulePyfunc` (the MLflow pyfunc wrapper) delegates here, so this module needs no
MLflow. Inputs are raw task rows in the official jsonl field layout (RTE: ``premise``, ``hypothesis``;
BoolQ: ``question``, ``passage``; ...); ids and labels are optional. Rows go through the same
normalisation and validation as training data (`capt.tasks.normalise.examples_from_rows`), so a
malformed row fails with the row number and field named. MultiRC rows expand to one prediction per
answer, as in its official evaluation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from capt import tasks
from capt.tasks.normalise import examples_from_rows
from pipelines.adapted import HEAD_WEIGHTS, load_artifact, predict, sequence_overhead
from pipelines.models.loading import load_model
from pipelines.provenance import verify_job_artifact

logger = logging.getLogger(__name__)

INVALID_LABEL = "<invalid>"
"""Label name returned when a generated answer matches no verbalizer (generation mode only)."""
_ID_KEY = {"csqa": "id"}
_LABEL_KEY = {"csqa": "answerKey"}


def _plain(value: Any) -> Any:
    """numpy/pandas scalars -> Python values; NaN (a missing cell) -> None."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return value
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def validated_examples(task: str, rows: Sequence[Mapping[str, Any]]) -> list[tasks.Example]:
    """Raw rows of `task` as examples, checked as training data is; the error names the row and field.

    The one input check of every way a capsule answers (the registry pyfunc, the Serve app). Each row is checked as a
    copy with a positional id and, when unlabelled, a placeholder label (never used).
    """
    id_key, label_key = _ID_KEY.get(task, "idx"), _LABEL_KEY.get(task, "label")
    placeholder = tasks.get(task).label_names[0]
    numbered = []
    for position, row in enumerate(rows):
        out = {key: _plain(value) for key, value in row.items()}
        out.pop("generated", None)
        out[id_key] = position
        if task == "multirc":
            for question in (out.get("passage") or {}).get("questions", []) or []:
                for answer in question.get("answers", []) or []:
                    answer.setdefault("label", 0)
        elif out.get(label_key) is None:
            out[label_key] = placeholder
        numbered.append((position + 1, out))
    return examples_from_rows(task, "predict", numbered, source="model input")


@contextlib.contextmanager
def _quiet_when_head_follows(artifact_dir: Path) -> Iterator[None]:
    """Silence transformers' load report while the base model loads, when the artifact holds the trained head.

    The report calls the classifier head "newly initialized ... consider training", which is wrong here: the
    artifact's trained head replaces it right after. Without a head file the report stays (it is then true).
    """
    if not (artifact_dir / HEAD_WEIGHTS).is_file():
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


class CapsulePredictor:
    """A base model with a trained artifact loaded, predicting label names for raw task rows.

    Before anything is loaded, the artifact is verified (`pipelines.provenance.verify_job_artifact`): its files
    against their manifest and the digest recorded for them (`expected_digest`, else result.json's), and its
    task, base model and method against `registered_name` when it is loaded as a registered model.
    """

    def __init__(self, artifact_dir: str | os.PathLike[str], result: Mapping[str, Any],
                 device: str | None = None, *, registered_name: str | None = None,
                 expected_digest: str | None = None, label: str | None = None) -> None:
        label = label or f"The artifact at {artifact_dir}"
        verify_job_artifact(artifact_dir, result, label, registered_name, expected_digest,
                            expected_from="the digest recorded for it")
        config = result["config"]
        self.task = result["task"]
        self.label_names = tasks.get(self.task).label_names
        self.mode = config["train"]["eval_mode"]
        self.batch_size = config["train"]["eval_batch_size"]
        self.max_new_tokens = config["model"]["max_new_tokens"]
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        with _quiet_when_head_follows(Path(artifact_dir)):
            loaded = load_model(result["model"], len(self.label_names), config["model"]["dtype"])
        self.tokenizer = loaded.tokenizer
        self.spec = loaded.spec
        # The head reads what it was trained to read; a result.json that names another readout is refused.
        self.model = load_artifact(loaded.model, artifact_dir, config["model"].get("readout")).to(self.device).eval()
        method = config["method"]
        self.collator = tasks.Collator(loaded.tokenizer, loaded.family, max_length=config["model"]["max_length"],
                                       capsule_slots=sequence_overhead(method["name"], method["options"]),
                                       input_format=config["task"].get("input_format", "capt"))
        logger.info("Loaded %s capsule for %s on %s (%s)", method["name"], self.task, result["model"], self.device)

    @classmethod
    def from_paths(cls, artifact_dir: str | os.PathLike[str], result_path: str | os.PathLike[str],
                   device: str | None = None, **verification: Any) -> CapsulePredictor:
        """Build from an artifact directory and the job's `result.json` (`verification`: as `__init__`)."""
        result = json.loads(Path(result_path).read_text(encoding="utf-8"))
        return cls(artifact_dir, result, device, **verification)

    def predict_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Label names for raw rows (one per row; one per answer for MultiRC)."""
        if not rows:
            return []
        examples = validated_examples(self.task, rows)
        ids = predict(self.model, examples, self.collator, self.spec, self.mode, self.batch_size,
                      self.max_new_tokens, self.tokenizer, self.device)
        return [self.label_names[i] if 0 <= i < len(self.label_names) else INVALID_LABEL for i in ids]

    def predict_frame(self, frame: Any) -> list[str]:
        """Label names for a pandas DataFrame (one raw row per line) or a list of row dicts."""
        rows = frame.to_dict(orient="records") if hasattr(frame, "to_dict") else list(frame)
        return self.predict_rows(rows)
