"""The bad-input matrix, part 1: `pipelines.train` and `pipelines/sweep.py`, each case through the entry
point's `main(argv)` in this process, and one case of each also as the real command.

Each case asserts exit status 2, one `error:` paragraph holding a phrase that names the problem, no
traceback, and that the earlier outputs (a finished job, an earlier report) are byte-for-byte as before.
Config problems point the job at the finished job's own folder; data problems fail after the config
is accepted, so they get a fresh output folder of their own (which must not receive a result either).
Part 2 (promote, report, tracking, --debug) and part 3 (`capt.load_capsule`) are in the sibling files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.bad_inputs import (
    GOOD_RTE,
    ROOT,
    Case,
    Places,
    check_case,
    earlier_outputs,
    rte_rows,
    write_rte,
)

SMOKE_JOB = str(ROOT / "pipelines" / "configs" / "job" / "smoke.yaml")
NOT_UTF8 = b"\xff\xfe"


def _job(places: Places, *args: str) -> list[str]:
    """A smoke job aimed at the finished job's folder."""
    return ["--config", SMOKE_JOB, f"output_dir={places.outputs / 'job'}", *args]


def _data_job(data: str, *args: str) -> Callable[[Places], list[str]]:
    """A smoke job on local data `inputs/<data>`, in a fresh output folder of the case."""
    return lambda p: ["--config", SMOKE_JOB, "task.source=local", f"task.data_dir={p.inputs / data}",
                      f"output_dir={p.scratch / 'job'}", *args]


def _sweep(name: str, *args: str) -> Callable[[Places], list[str]]:
    return lambda p: ["--config", str(p.inputs / name), f"storage_path={p.outputs / 'sweeps'}", *args]


def _make_inputs(inputs: Path) -> None:
    files = {
        "syntax.yaml": b"model:\n  name: tiny-t5\n task: [\n",
        "list.yaml": b"- model\n- task\n",
        "scalar.yaml": b"42\n",
        "duplicate.yaml": b"name: a\nname: b\n",
        "tabs.yaml": b"tracking:\n\tenabled: false\n",
        "latin1.yaml": b"name: caf\xe9\n",
        "sweep.yaml": b"name: bad-inputs\ntracking:\n  enabled: false\n",
        "tracked.yaml": b"name: bad-inputs\n",
        "unknown.yaml": b"name: bad-inputs\nschedule: fifo\n",
        "seed-typo.yaml": b"name: bad-inputs\ntracking:\n  enabled: false\nseed: [0]\n",
        "binary.yaml": b"model:\n  name: tiny-t5\noutput_dir: !!binary aGVsbG8=\n",
        "deep.yaml": b"name: bad-inputs\ntags: " + b"[" * 20_000 + b"]" * 20_000 + b"\n",
    }
    for name, data in files.items():
        (inputs / name).write_bytes(data)
    (inputs / "folder.yaml").mkdir()
    (inputs / "users-folder").mkdir()
    (inputs / "users-folder" / "notes.txt").write_text("my own notes")
    (inputs / "no-config-model").mkdir()
    good = rte_rows(6)
    write_rte(inputs / "not-utf8", json.dumps(GOOD_RTE).encode() + b'\n{"premise": "caf' + NOT_UTF8
              + b'", "hypothesis": "x", "label": "entailment", "idx": 9}\n')
    write_rte(inputs / "bad-json", [*good[:2], '{"premise": "x", '])
    write_rte(inputs / "missing-field", [*good[:3], {k: v for k, v in GOOD_RTE.items() if k != "hypothesis"}])
    write_rte(inputs / "bad-label", [*good[:4], dict(GOOD_RTE, idx=7, label="maybe")])
    write_rte(inputs / "not-object", [*good[:1], "[1, 2, 3]"])
    write_rte(inputs / "empty", [])
    write_rte(inputs / "one-row", good[:1])
    write_rte(inputs / "duplicate-idx", [good[0], good[0]])
    write_rte(inputs / "missing-val", good)
    (inputs / "missing-val" / "rte" / "val.jsonl").unlink()
    (inputs / "missing-task" / "cb").mkdir(parents=True)
    write_rte(inputs / "bad-parquet", good)
    (inputs / "bad-parquet" / "rte" / "train.jsonl").unlink()
    (inputs / "bad-parquet" / "rte" / "train.parquet").write_bytes(b"PAR1 this is not parquet")
    write_rte(inputs / "duplicate-key", [*good[:1], json.dumps(GOOD_RTE)[:-1] + ', "label": "not_entailment"}'])
    write_rte(inputs / "deep-json", [*good[:2], '{"premise": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    write_rte(inputs / "symlink-loop", good)
    (inputs / "symlink-loop" / "rte" / "train.jsonl").unlink()
    (inputs / "symlink-loop" / "rte" / "train.jsonl").symlink_to("train.jsonl")
    write_rte(inputs / "fifo", good)
    (inputs / "fifo" / "rte" / "train.jsonl").unlink()
    os.mkfifo(inputs / "fifo" / "rte" / "train.jsonl")


CASES = [
    # pipelines.train: the config itself
    Case("train-yaml-syntax", "train", lambda p: ["--config", str(p.inputs / "syntax.yaml")],
         "line 3, column 2: did not find expected key"),
    Case("train-yaml-list", "train", lambda p: ["--config", str(p.inputs / "list.yaml")],
         "must be a mapping of sections at the top level"),
    Case("train-config-missing", "train", lambda p: ["--config", str(p.inputs / "nope.yaml")], "does not exist"),
    Case("train-given-a-sweep-config", "train", lambda p: ["--config", str(ROOT / "pipelines/configs/smoke.yaml")],
         "Invalid job config: this is a sweep config, not a job config (it has tasks, models, methods, seeds, job): "
         "run it with python pipelines/sweep.py --config FILE"),
    Case("sweep-given-a-job-config", "sweep", lambda p: ["--config", SMOKE_JOB],
         "this is a job config, not a sweep config (it has model, task, method, train): run it with "
         "python -m pipelines.train --config FILE."),
    Case("train-unknown-key", "train", lambda p: _job(p, "train.epochs=3"),
         "train.epochs: unknown key (value 3; allowed keys: batch_size, eval_batch_size, grad_accum_steps, "),
    Case("train-malformed-override", "train", lambda p: _job(p, "train.max_steps"), "is not key.sub=value"),
    Case("train-yaml-binary-tag", "train", lambda p: ["--config", str(p.inputs / "binary.yaml")],
         "line 3: the tag '!!binary' builds a value that is not plain YAML"),
    Case("train-override-binary-tag", "train", lambda p: _job(p, "train.max_steps=!!binary aGVsbG8="),
         "has a value that is not plain: the tag '!!binary'"),
    Case("train-output-dir-is-a-file", "train", lambda p: _job(p, f"output_dir={p.inputs / 'syntax.yaml'}"),
         "syntax.yaml' is a file, not a folder"),
    Case("train-output-dir-under-a-file", "train", lambda p: _job(p, f"output_dir={p.inputs / 'syntax.yaml' / 'job'}"),
         "cannot be created: "),
    Case("train-output-dir-on-proc", "train", lambda p: _job(p, "output_dir=/proc/capt-job"),
         "output_dir='/proc/capt-job' is on a kernel file system (proc)"),
    Case("train-output-dir-on-proc-and-a-bad-lr", "train",
         lambda p: _job(p, "output_dir=/proc/capt-job", "optim.lr=-1"),
         "(2 problems): output_dir='/proc/capt-job' is on a kernel file system (proc): nothing written there is "
         "kept; optim.lr=-1: Input should be greater than 0"),
    Case("train-output-dir-of-other-files", "train", lambda p: _job(p, f"output_dir={p.inputs / 'users-folder'}"),
         "is a folder that holds no job but other files (notes.txt)"),
    Case("train-seed-out-of-range", "train", lambda p: _job(p, "seed=99999999999999999999999"),
         "seed=99999999999999999999999: Input should be less than or equal to 4294967295"),
    Case("train-infinite-lr", "train", lambda p: _job(p, "optim.lr=inf"), "optim.lr='inf': Input should be a finite"),
    Case("train-generated-size-too-large", "train", lambda p: _job(p, "task.generated_size=100000000000"),
         "task.generated_size=100000000000: Input should be less than or equal to 1000000"),
    Case("train-bad-capsule-option", "train", lambda p: _job(p, "method.options.fusion=glue"),
         "method.options for method 'capt'"),
    Case("train-option-of-another-method", "train", lambda p: _job(p, "method.name=lora",
                                                                      "method.options.num_tokens=4"),
         "method.options for method 'lora'"),
    Case("train-unknown-hub-id", "train", lambda p: _job(p, "model.name=nobody/no-such-model"),
         "not in the local Hugging Face cache"),
    Case("train-model-folder-without-config", "train",
         lambda p: _job(p, f"model.name={p.inputs / 'no-config-model'}"), "has no config.json"),
    Case("train-local-data-without-dir", "train", lambda p: _job(p, "task.source=local"),
         "set task.data_dir or CAPT_DATA_DIR"),
    # pipelines.train: the data, named by file and line
    Case("train-data-not-utf8", "train", _data_job("not-utf8"),
         lambda p: f"{p.inputs / 'not-utf8' / 'rte' / 'train.jsonl'}: line 2: not UTF-8 text: byte 0xff"),
    Case("train-data-bad-json", "train", _data_job("bad-json"), "train.jsonl: line 3: invalid JSON"),
    Case("train-data-duplicate-key", "train", _data_job("duplicate-key"),
         "train.jsonl: line 2: the key 'label' appears twice in one object"),
    Case("train-data-deep-json", "train", _data_job("deep-json"), "train.jsonl: line 3: the JSON nests deeper"),
    Case("train-data-symlink-loop", "train", _data_job("symlink-loop"), "is a symlink loop"),
    Case("train-data-fifo", "train", _data_job("fifo"), "is a FIFO (named pipe), not a regular file"),
    Case("train-data-missing-field", "train", _data_job("missing-field"),
         "train.jsonl: line 4: field 'hypothesis': missing field"),
    Case("train-data-unknown-label", "train", _data_job("bad-label"), "line 5: field 'label': unknown label 'maybe'"),
    Case("train-data-row-not-object", "train", _data_job("not-object"), "line 2: expected a JSON object, got list"),
    Case("train-data-empty-train", "train", _data_job("empty"), "the split is empty"),
    Case("train-data-too-small-for-validation", "train", _data_job("one-row", "task.validation_fraction=0.2"),
         "has 1 row(s), too few for the train/validation cut (validation_fraction=0.2"),
    Case("train-data-duplicate-id", "train", _data_job("duplicate-idx"),
         "line 2: field 'idx': duplicate example id '0'"),
    Case("train-data-missing-val-file", "train", _data_job("missing-val"), "missing file val.jsonl"),
    Case("train-data-missing-task-folder", "train", _data_job("missing-task"), "missing task folder 'rte'"),
    Case("train-data-dir-missing", "train", _data_job("no-such-dir"), "data directory does not exist"),
    Case("train-data-corrupt-parquet", "train", _data_job("bad-parquet"), "unreadable parquet file"),
    # pipelines/sweep.py: config problems, all found before Ray or MLflow start
    Case("sweep-yaml-syntax", "sweep", _sweep("syntax.yaml"), "line 3, column 2"),
    Case("sweep-yaml-list", "sweep", _sweep("list.yaml"), "but it holds a list"),
    Case("sweep-yaml-scalar", "sweep", _sweep("scalar.yaml"), "but it holds a single value (int)"),
    Case("sweep-yaml-duplicate-key", "sweep", _sweep("duplicate.yaml"), "line 2, column 1: found duplicate key name"),
    Case("sweep-yaml-tab-indent", "sweep", _sweep("tabs.yaml"), "line 2, column 1: found character that cannot"),
    Case("sweep-yaml-not-utf8", "sweep", _sweep("latin1.yaml"), "is not UTF-8 text: byte 0xe9 at line 1, column 10"),
    Case("sweep-config-is-a-folder", "sweep", _sweep("folder.yaml"), "is a folder; --config takes a YAML file"),
    Case("sweep-config-missing", "sweep", _sweep("nope.yaml"), "does not exist"),
    Case("sweep-unknown-top-key", "sweep", _sweep("unknown.yaml"),
         "schedule: unknown key (value 'fifo'; allowed keys: name, tasks, models, methods, seeds, data_source,"),
    Case("sweep-key-typo-seed", "sweep", _sweep("seed-typo.yaml"),
         "seed: unknown key (value [0]; allowed keys: name, tasks, models, methods, seeds, data_source, job,"),
    Case("sweep-section-key-typo", "sweep", _sweep("sweep.yaml", "methods=[{name: capt, labl: x}]"),
         "methods.0.labl: unknown key (value 'x'; allowed keys: name, label, options, overrides, models, select)"),
    Case("sweep-bad-override-value", "sweep", _sweep("sweep.yaml", "seeds=[0,"),
         "'seeds=[0,' has a value that is not valid YAML"),
    Case("sweep-unknown-hub-id", "sweep", _sweep("sweep.yaml", "models=[nobody/no-such-model]"),
         "not in the local Hugging Face cache"),
    Case("sweep-bad-capsule-option", "sweep", _sweep("sweep.yaml", "methods=[{name: capt, options: {length: 0}}]"),
         "method.options for method 'capt': Invalid CapsuleConfig: length=0"),
    Case("sweep-yaml-too-deep", "sweep", _sweep("deep.yaml"), "line 2: mappings and lists nest more than 32 levels"),
    Case("sweep-seed-out-of-range", "sweep", _sweep("sweep.yaml", "seeds=[99999999999999999999999]"),
         "seeds.0=99999999999999999999999: Input should be less than or equal to 4294967295"),
    Case("sweep-data-dir-missing", "sweep", _sweep("sweep.yaml", "data_source=local",
                                                   "job.task.data_dir=/nonexistent/capt-data"),
         "cannot read their data: /nonexistent/capt-data: field 'data_dir': data directory does not exist"),
    Case("sweep-storage-is-a-file", "sweep", _sweep("sweep.yaml", "storage_path=/etc/hostname"),
         "storage_path='/etc/hostname' is a file, not a folder"),
    Case("sweep-mlflow-store-on-proc", "sweep", lambda p: [*_sweep("tracked.yaml")(p), "tracking.local_dir=/proc/x"],
         "tracking.local_dir='/proc/x' is on a kernel file system"),
    Case("sweep-unknown-task", "sweep", _sweep("sweep.yaml", "tasks=[mnli]"), "task.name='mnli': Input should be"),
    Case("sweep-pack-unpackable-method", "sweep", _sweep("sweep.yaml", "pack.max_members=2", "methods=[{name: lora}]"),
         "pack: method 'lora' does not pack: only CaPT and its ablations"),
    Case("sweep-unreachable-mlflow", "sweep", lambda p: [*_sweep("tracked.yaml")(p), f"tracking.uri={p.closed_uri}"],
         "Cannot reach the MLflow tracking server"),
    Case("sweep-unreachable-ray", "sweep", _sweep("sweep.yaml"), "Cannot reach the Ray cluster (RAY_ADDRESS)",
         env=lambda p: {"RAY_ADDRESS": p.closed_uri.removeprefix("http://")}),
    Case("sweep-not-mlflow", "sweep", lambda p: [*_sweep("tracked.yaml")(p), f"tracking.uri={p.http_uri}"],
         "is not an MLflow server"),
    Case("sweep-credentials-in-uri", "sweep",
         lambda p: [*_sweep("tracked.yaml")(p), "tracking.uri=http://ann:s3cret@127.0.0.1:5000"],
         "holds credentials"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, closed_uri: str, http_uri: str) -> Places:
    inputs = tmp_path_factory.mktemp("bad-inputs")
    _make_inputs(inputs)
    return Places(earlier_outputs(tmp_path_factory.getbasetemp()), inputs, inputs, closed_uri, http_uri)


REAL_COMMANDS = [case for case in CASES
                 if case.name in ("train-data-bad-json", "sweep-unreachable-ray", "sweep-key-typo-seed")]
"""The cases also run as the real command (`python -m pipelines.train`, `python pipelines/sweep.py`)."""


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_bad_input_fails_cleanly_and_changes_nothing(case: Case, places: Places, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    check_case(case, places, tmp_path, capsys)
    _assert_no_result(tmp_path / "job")


@pytest.mark.parametrize("case", REAL_COMMANDS, ids=[c.name for c in REAL_COMMANDS])
@pytest.mark.slow
def test_the_real_command_fails_cleanly_and_changes_nothing(case: Case, places: Places, tmp_path: Path) -> None:
    check_case(case, places, tmp_path)
    _assert_no_result(tmp_path / "job")


def _assert_no_result(left: Path) -> None:
    """A data case's own output folder holds no result a later resume could trust."""
    assert not (left / "result.json").exists() and not (left / "artifact").exists()
