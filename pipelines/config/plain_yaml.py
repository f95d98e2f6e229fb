"""Plain YAML only: config text is scanned event by event before any object is built from it.

A config holds mappings, lists, strings, numbers, booleans and nulls, a few levels deep. PyYAML's safe loader
(which OmegaConf uses) also builds `!!binary` bytes, `!!omap` pairs and sets, and builds nested values
recursively, so a 20,000-deep list ends in a RecursionError with no file or line. The event stream of
`yaml.parse` is produced without recursion, so scanning it first refuses both with the line that holds them.
"""

from __future__ import annotations

import yaml

MAX_NESTING = 32
"""Deepest nesting of mappings and lists a config may have (the shipped ones use at most 4)."""
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map"))
"""Explicit tags that still denote a plain value (`!!str 5` is the string "5")."""
_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
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
            depth += isinstance(event, _OPENS) - isinstance(event, _CLOSES)
            if depth > MAX_NESTING:
                return (f"line {event.start_mark.line + 1}: mappings and lists nest more than {MAX_NESTING} "
                        "levels deep; a config needs a few")
    except yaml.YAMLError:
        return None
    return None
