"""How much a trained CaPT capsule moves a model: a job's artifact scored on the test split as trained, and again
with its task vectors zeroed (the instance-mean anchor and the trained head remain, as in the head-only+anchor row).

    python -m benchmarks.capsule_influence JOB_DIR [JOB_DIR ...] [--data-dir DIR] [--out FILE.json]

The test split is rebuilt from the job's resolved task config (`--data-dir` replaces its data folder). A capsule
whose zeroing changes no prediction has not moved the model past what its head reads from the anchor.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import Table, markdown_table

TITLE = "A trained capsule's test score, as trained and with its task vectors zeroed"
COLUMNS = ("job", "method", "lr", "seed", "test_score", "job_test_score", "test_score_zeroed",
           "changed_predictions_pct", "vector_norm_per_layer")


def scored(predictor: Any, examples: list) -> tuple[list[int], dict[str, float]]:
    """(predicted label ids, the task's metrics) of `predictor`'s model on `examples`."""
    from pipelines.adapted import metrics_of, predict

    ids = predict(predictor.model, examples, predictor.collator, predictor.spec, predictor.mode,
                  predictor.batch_size, predictor.max_new_tokens, predictor.tokenizer, predictor.device)
    return ids, metrics_of(examples, ids)


def influence(job_dir: Path, data_dir: Path | None = None) -> dict[str, Any]:
    """One row of `COLUMNS` for the CaPT job in `job_dir` (its task files read from `data_dir` when given);
    ValueError when it is not a CaPT job with task vectors."""
    from pipelines.capsule_predictor import CapsulePredictor
    from pipelines.config.load import validate_job_config
    from pipelines.training.setup import load_data

    result = json.loads((job_dir / "result.json").read_text(encoding="utf-8"))
    predictor = CapsulePredictor(job_dir / "artifact", result, device="cpu")
    vectors = [capsule.vectors for capsule in getattr(predictor.model, "capsules", [])  # (L, k, D) each
               if capsule.config.task_vector]
    if not vectors:
        raise ValueError(f"{job_dir}: method {result['config']['method']['name']!r} has no trained task vectors "
                         "(a CaPT job with task_vector true is needed)")
    config = result["config"]
    if data_dir is not None:
        config = {**config, "task": {**config["task"], "data_dir": str(data_dir)}}
    examples = list(load_data(validate_job_config(config)).test)
    with torch.no_grad():
        trained_ids, trained = scored(predictor, examples)
        norms = torch.cat([v.detach().norm(dim=-1).flatten() for v in vectors])  # (layers * k,)
        for vector in vectors:
            vector.zero_()
        zeroed_ids, zeroed = scored(predictor, examples)
    changed = sum(a != b for a, b in zip(trained_ids, zeroed_ids, strict=True))
    return {"job": job_dir.name, "method": result["config"]["method"]["name"],
            "lr": result.get("optimizer", {}).get("lr"), "seed": result["config"]["seed"],
            "test_score": trained["score"], "job_test_score": result["metrics"].get("test_score"),
            "test_score_zeroed": zeroed["score"], "changed_predictions_pct": 100.0 * changed / len(examples),
            "vector_norm_per_layer": float(norms.mean())}


def main(argv: list[str] | None = None) -> int:
    """CLI: one row per job folder; exit 2 with one paragraph when a folder cannot be measured."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capsule_influence",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("jobs", nargs="+", type=Path, help="CaPT job output folders (artifact/ and result.json)")
    parser.add_argument("--data-dir", type=Path, help="the task files' folder, instead of the job's own")
    parser.add_argument("--out", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    missing = [f"{job}: no {name}" for job in args.jobs for name in ("artifact", "result.json")
               if not (job / name).exists()]
    if missing:
        print("error: cannot measure these jobs: " + "; ".join(missing) + ".", file=sys.stderr)
        return 2
    try:
        rows = [influence(job, args.data_dir) for job in args.jobs]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(markdown_table(Table(TITLE, list(COLUMNS), rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
