"""Reading config sources: a YAML file, a dict and `key.sub=value` overrides, merged by OmegaConf.

Every problem with a source is a `PipelineConfigError` that names it: the file (and the line and column
of a YAML syntax error, or of a byte that is not UTF-8), or the override.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from capt.errors import ConfigError


class PipelineConfigError(ConfigError):
    """A job, sweep or serve config is invalid; the message lists every problem (key, value given, what is allowed)."""


def merge_sources(path: str | os.PathLike | None, overrides: Sequence[str],
                  base: dict[str, Any] | None) -> dict[str, Any]:
    """Merge a YAML file, a dict and dot-list overrides with OmegaConf (later wins)."""
    parts = [read_yaml_config(path)] if path else []
    parts += [OmegaConf.create(base or {}), *parse_overrides(overrides)]
    try:
        return OmegaConf.to_container(OmegaConf.merge(*parts), resolve=True)
    except OmegaConfBaseException as err:  # an interpolation such as ${missing.key}
        key = getattr(err, "full_key", None)
        where = "".join([f" {path}" if path else "", f" at key {key}" if key else ""])
        raise PipelineConfigError(f"Cannot resolve the config{where}: {str(err).splitlines()[0]}.") from None


def read_yaml_config(path: str | os.PathLike) -> DictConfig:
    """A YAML config file as an OmegaConf mapping; `PipelineConfigError` names the file (and line and column)."""
    text = _config_text(Path(path))
    if problem := plain_yaml_problem(text):
        raise PipelineConfigError(f"The config {path} is not a plain config: {problem}.")
    try:
        loaded = OmegaConf.load(io.StringIO(text))  # OmegaConf's loader: typed floats, duplicate keys refused
    except yaml.YAMLError as err:
        if NODE_LIMIT_TEXT in str(err):
            raise PipelineConfigError(f"The config {path} holds more values than one config may: {TOO_MANY_NODES}.") \
                from None
        raise PipelineConfigError(f"The config {path} is not valid YAML: {yaml_problem(err)}. Fix the file there "
                             "(YAML indents with spaces, one `key: value` per line, each key once).") from None
    except OSError:  # what OmegaConf raises for a single value at the top level
        loaded = None
    if not isinstance(loaded, DictConfig):
        found = "a list" if loaded is not None else f"a single value ({type(yaml.safe_load(text)).__name__})"
        raise PipelineConfigError(f"The config {path} must be a mapping of sections at the top level (lines like "
                             f"`model:` and `train:`, see pipelines/configs/), but it holds {found}.")
    return loaded


def _config_text(path: Path) -> str:
    """The text of a config file; a missing, unreadable or non-UTF-8 file is a `PipelineConfigError`."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineConfigError(f"The config file {path} does not exist; check --config (the shipped configs are "
                             "in pipelines/configs/).") from None
    except IsADirectoryError:
        raise PipelineConfigError(f"The config {path} is a folder; --config takes a YAML file.") from None
    except UnicodeDecodeError as err:
        data = path.read_bytes()
        line = data[:err.start].count(b"\n") + 1
        column = err.start - data.rfind(b"\n", 0, err.start)
        raise PipelineConfigError(f"The config {path} is not UTF-8 text: byte {data[err.start]:#04x} at line {line}, "
                             f"column {column}. Save it as UTF-8.") from None
    except OSError as err:
        raise PipelineConfigError(f"Cannot read the config {path}: {err.strerror or err}.") from None


NODE_LIMIT_TEXT = "node expansion exceeds the configured limit"
"""OmegaConf's words when a YAML text expands to more nodes than it allows (its guard against alias bombs)."""
TOO_MANY_NODES = ("OmegaConf reads at most 10,000 YAML values per text, a guard against alias bombs; the text is "
                  "valid YAML, but a grid of this size is not something a sweep runs: give fewer values")


def parse_overrides(overrides: Sequence[str]) -> list[DictConfig]:
    """`key.sub=value` strings as OmegaConf mappings; raises once naming every malformed one."""
    parsed, problems = [], []
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or "" in key.strip().split("."):
            problems.append(f"{_shown(text)} is not key.sub=value")
            continue
        if problem := plain_yaml_problem(value):
            problems.append(f"{_shown(text)} has a value that is not plain: {problem.partition(': ')[2]}")
            continue
        try:
            parsed.append(OmegaConf.from_dotlist([text]))
        except (yaml.YAMLError, OmegaConfBaseException) as err:
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            if NODE_LIMIT_TEXT in problem:
                problems.append(f"{_shown(text)} holds more values than one config may ({TOO_MANY_NODES})")
            else:
                problems.append(f"{_shown(text)} has a value that is not valid YAML ({problem}; quote it)")
    if problems:
        raise PipelineConfigError("Invalid overrides: " + "; ".join(problems) + " (e.g. train.max_steps=20).")
    return parsed


def _shown(text: str, limit: int = 80) -> str:
    """`text` quoted for a message, cut to `limit` characters (an override may be a pasted file)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def yaml_problem(err: yaml.YAMLError) -> str:
    """A PyYAML error as `line L, column C: problem (context)`, positions 1-based."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark, context, context_mark = (getattr(err, k, None) for k in ("problem_mark", "context", "context_mark"))
    if context:
        since = f" at line {context_mark.line + 1}, column {context_mark.column + 1}" if context_mark else ""
        problem += f" ({context}{since})"
    return (f"line {mark.line + 1}, column {mark.column + 1}: " if mark else "") + problem


# Plain YAML only: config text is scanned event by event before any object is built from it.
# A config holds mappings, lists, strings, numbers, booleans and nulls, a few levels deep. PyYAML's safe loader
# (which OmegaConf uses) also builds `!!binary` bytes, `!!omap` pairs and sets, and builds nested values
# recursively, so a 20,000-deep list ends in a RecursionError with no file or line. The event stream of
# `yaml.parse` is produced without recursion, so scanning it first refuses both with the line that holds them.

MAX_NESTING = 32
"""Deepest nesting of mappings and lists a config may have (the shipped ones use at most 4)."""
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map"))
"""Explicit tags that still denote a plain value (`!!str 5` is the string "5")."""
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def plain_yaml_problem(text: str) -> str | None:
    """Why `text` is not plain YAML (`line L: ...`), or None. Syntax errors are left to the loader that follows."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            tag = getattr(event, "tag", None)
            if tag is not None and tag not in PLAIN_TAGS:
                return (f"line {event.start_mark.line + 1}: the tag {tag.replace('tag:yaml.org,2002:', '!!')!r} "
                        "builds a value that is not plain YAML; a config holds only mappings, lists, strings, "
                        "numbers, booleans and null (quote the text if it is meant as a string)")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_NESTING:
                return (f"line {event.start_mark.line + 1}: mappings and lists nest more than {MAX_NESTING} "
                        "levels deep; a config needs a few")
    except yaml.YAMLError:
        return None
    return None
