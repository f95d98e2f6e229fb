"""Load a task's official splits from the hub, a local directory or the generator, then cut the splits.

Every source yields raw rows that go through `capt.tasks.normalise.examples_from_rows`, so the records
(and the validation) are the same whichever source is used. Local layout::

    <data_dir>/<task>/train.jsonl   (or train.parquet)   official train split
    <data_dir>/<task>/val.jsonl     (or val.parquet)     official validation split (our test set)

Jsonl is read with the standard library (so errors carry line numbers); parquet with pyarrow (installed
with `datasets`). The hub path imports `datasets` lazily.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from capt.tasks.config import DATA_DIR_ENV, DataConfig
from capt.tasks.errors import TaskDataError, TaskUsageError
from capt.tasks.generated import generate_rows
from capt.tasks.normalise import examples_from_rows
from capt.tasks.records import Example, Splits
from capt.tasks.registry import get
from capt.tasks.splits import split_train_validation, subsample
from capt.tasks.validation import MAX_TEXT_CHARS, check_room_for_validation

logger = logging.getLogger(__name__)

OFFICIAL_SPLITS: tuple[str, ...] = ("train", "val")
"""Official split names, as in the local file names."""
HUB_SPLITS: dict[str, str] = {"train": "train", "val": "validation"}
"""Official split name -> split name on the hub."""
EXTENSIONS: tuple[str, ...] = (".jsonl", ".parquet")
"""Local file types, in the order they are looked for."""

RawRows = Iterator[tuple[int, Any]]


def read_jsonl(path: str | Path) -> RawRows:
    """(line number, object) for each non-blank line; a bad line raises `TaskDataError` naming it."""
    try:
        with open(path, "rb") as handle:  # decoded line by line, so that a bad byte is reported with its line
            yield from _jsonl_rows(handle, path)
    except OSError as err:
        raise TaskDataError(f"cannot read the file ({err.strerror or err})", path=str(path)) from None


MAX_LINE_BYTES = 1_000_000
"""Longest jsonl line read, in bytes: room for a row of text fields at `MAX_TEXT_CHARS` each (the longest real row,
MultiRC's, is about 20,000); a longer line is refused after reading this much of it, never read whole."""


def _jsonl_rows(handle: BinaryIO, path: str | Path) -> RawRows:
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw.rstrip(b"\n")) > MAX_LINE_BYTES:
            raise TaskDataError(f"the line is longer than {MAX_LINE_BYTES:,} bytes, the most a row may take (each "
                                f"text at most {MAX_TEXT_CHARS:,} characters); shorten or drop the row",
                                path=str(path), row=number)
        line = _decode_line(raw, number, path)
        if not line.strip():
            continue
        if _nests_too_deep(line):  # refused before the parser recurses to Python's limit
            raise _too_deep(path, number)
        try:
            yield number, json.loads(line, object_pairs_hook=_distinct_keys)
        except json.JSONDecodeError as err:
            raise TaskDataError(f"invalid JSON: {err.msg} (column {err.colno})", path=str(path),
                                row=number) from None
        except _DuplicateKeyError as err:
            raise TaskDataError(f"the key {err.args[0]!r} appears twice in one object; each field once",
                                path=str(path), row=number) from None
        except RecursionError:
            raise _too_deep(path, number) from None


def _too_deep(path: str | Path, number: int) -> TaskDataError:
    return TaskDataError("the JSON nests deeper than Python can read; a row is a flat object of fields",
                         path=str(path), row=number)


MAX_JSON_NESTING = 100
"""Deepest nesting of lists and objects a data row may have (MultiRC's rows, the deepest, use 5)."""


def _nests_too_deep(line: str) -> bool:
    """Whether `line` nests lists and objects past `MAX_JSON_NESTING` (brackets inside strings not counted).

    Parsing such a line would exhaust Python's recursion limit deep inside the decoder; a line with fewer
    opening brackets than the limit is passed without a scan."""
    if line.count("[") + line.count("{") <= MAX_JSON_NESTING:
        return False
    depth, in_string, escaped = 0, False, False
    for char in line:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_NESTING:
                return True
        elif char in "]}":
            depth -= 1
    return False


class _DuplicateKeyError(ValueError):
    """A JSON object names one key twice (json.loads would silently keep the last)."""


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    if len(row) != len(pairs):
        raise _DuplicateKeyError(repeated_key(pairs))
    return row


def repeated_key(pairs: list[tuple[str, Any]]) -> str | None:
    """The first key given twice among one JSON object's `pairs` (a `json.loads` `object_pairs_hook`'s argument),
    or None."""
    seen: set[str] = set()
    return next((key for key, _ in pairs if key in seen or seen.add(key)), None)


def _decode_line(raw: bytes, number: int, path: str | Path) -> str:
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as err:
        raise TaskDataError(f"not UTF-8 text: byte {raw[err.start]:#04x} at column {err.start + 1}; save the "
                            "file as UTF-8", path=str(path), row=number) from None


def read_parquet(path: str | Path) -> RawRows:
    """(row number, row dict) for each row of a parquet file (needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:  # pragma: no cover - pyarrow comes with datasets
        raise ImportError("Reading parquet needs pyarrow: pip install 'capt[pipeline]'.") from err
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise TaskDataError(f"unreadable parquet file: {err}", path=str(path)) from None
    yield from enumerate(table.to_pylist(), start=1)


def find_split_file(data_dir: str | Path | None, task: str, split: str) -> Path:
    """The local file of one official split; `TaskDataError` names what is missing and the layout."""
    layout = "expected layout <data_dir>/<task>/{train,val}.jsonl (or .parquet)"
    if data_dir is None:
        raise TaskDataError(f"no local data directory: set {DATA_DIR_ENV} or DataConfig.data_dir "
                            f"({layout}), or use source='generated' or 'hub'", field="data_dir")
    root = Path(data_dir)
    if not root.is_dir():
        raise TaskDataError(f"data directory {_not_a_folder(root)} ({layout})", path=str(root), field="data_dir")
    folder = root / task
    if os.path.lexists(folder) and not folder.is_dir():
        raise TaskDataError(f"the task folder {_not_a_folder(folder)} ({layout})", path=str(folder))
    if not folder.is_dir():
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise TaskDataError(f"missing task folder {task!r} ({layout}; folders found: {found})",
                            path=str(folder))
    for ext in EXTENSIONS:
        candidate = folder / f"{split}{ext}"
        if candidate.is_file():
            return candidate
        if os.path.lexists(candidate):
            raise TaskDataError(f"the split file {_not_a_file(candidate)}; {layout}", path=str(candidate))
    hint = " (BoolQ's official train split is not in this directory)" if task == "boolq" else ""
    found = sorted(p.name for p in folder.iterdir())
    raise TaskDataError(f"missing file {split}.jsonl or {split}.parquet{hint}; {layout}; files found: "
                        f"{found}", path=str(folder / f"{split}.jsonl"))


def _not_a_folder(path: Path) -> str:
    """Why the folder `path` cannot be used (it is known not to be a folder)."""
    return _link_problem(path) or ("is not a folder" if os.path.lexists(path) else "does not exist")


def _not_a_file(path: Path) -> str:
    """Why `path`, which exists as a name, cannot be read as a split file."""
    if problem := _link_problem(path):
        return problem
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"is {kind}, not a regular file: copy the data into a file"


def _link_problem(path: Path) -> str | None:
    """A symlink that does not lead to anything (a loop, or a missing target), or None."""
    if not path.is_symlink():
        return None
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 raises it for a loop
        return "is a symlink loop (it leads back to itself)"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symlink loop (it leads back to itself)"
        return f"is a symlink to {os.readlink(path)!r}, which does not exist"
    return None


def _local_rows(task: str, split: str, config: DataConfig) -> tuple[str, RawRows]:
    path = find_split_file(config.data_dir, task, split)
    reader = read_parquet if path.suffix == ".parquet" else read_jsonl
    return str(path), reader(path)


def _generated_rows(task: str, split: str, config: DataConfig) -> tuple[str, RawRows]:
    size = config.generated_size if split == "train" else config.generated_eval_size
    rows = generate_rows(task, split, size, config.generated_seed)
    return f"generated:{task}/{split}", enumerate(rows, start=1)


def _hub_rows(task: str, split: str, config: DataConfig) -> tuple[str, RawRows]:
    try:
        import datasets
    except ImportError as err:
        raise ImportError("source='hub' needs the `datasets` package: pip install 'capt[hub]'.") from err
    spec = get(task)
    args = (spec.hub_path,) if spec.hub_config is None else (spec.hub_path, spec.hub_config)
    source = f"hub:{spec.hub_path}/{spec.hub_config or 'default'}[{HUB_SPLITS[split]}]"
    try:
        dataset = datasets.load_dataset(*args, split=HUB_SPLITS[split], cache_dir=config.hub_cache_dir)
    except Exception as err:  # network, offline mode without a cache, unknown config, ...
        raise TaskDataError(f"could not load from the Hugging Face hub ({type(err).__name__}: {err}); "
                            "offline, use source='local' or 'generated'", path=source) from err
    return source, enumerate(dataset, start=1)


_READERS = {"local": _local_rows, "generated": _generated_rows, "hub": _hub_rows}


def load_split(task: str, split: str, config: DataConfig | None = None) -> list[Example]:
    """All normalised examples of one official split (``train`` or ``val``) from `config.source`."""
    return _read_split(task, split, config or DataConfig())[1]


def _read_split(task: str, split: str, config: DataConfig) -> tuple[str, list[Example]]:
    """(source description, examples) of one official split."""
    get(task)
    if split not in OFFICIAL_SPLITS:
        raise TaskUsageError(f"Unknown official split {split!r}; valid splits: {', '.join(OFFICIAL_SPLITS)}.")
    source, rows = _READERS[config.source](task, split, config)
    examples = examples_from_rows(task, split, rows, source)
    logger.info("loaded %d %s/%s examples from %s", len(examples), task, split, source)
    return source, examples


def load_splits(task: str, config: DataConfig | None = None) -> Splits:
    """The paper's splits: official train cut 90/10 (stratified, seeded); official validation = test.

    A train split too small to leave a validation example is refused before the test split is read.
    """
    config = config or DataConfig()
    source, official_train = _read_split(task, "train", config)
    check_room_for_validation(official_train, config.validation_fraction, source)
    test = load_split(task, "val", config)
    train, validation = split_train_validation(official_train, config.validation_fraction, config.seed)
    splits = Splits(
        train=subsample(train, config.max_train_examples, config.seed),
        validation=subsample(validation, config.max_eval_examples, config.seed),
        test=subsample(test, config.max_eval_examples, config.seed),
    )
    logger.info("%s splits (seed %d, source %s): %s", task, config.seed, config.source, splits.sizes())
    if warning := single_label_warning(splits.train, source):
        logger.warning(warning)
    return splits


def single_label_warning(train: list[Example], source: str) -> str | None:
    """A warning when every training example has one label: the job can only learn to answer it always."""
    labels = {example.label for example in train}
    if len(labels) != 1:
        return None
    return (f"every one of the {len(train)} training examples from {source} has label {labels.pop()}: the model "
            "can only learn to give that answer; check the data (a filtered or sorted file?)")
