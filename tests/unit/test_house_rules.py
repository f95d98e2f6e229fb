"""The architecture's rules: pipelines -> capt only; capt never imports ray, mlflow or accelerate; only the
tracking package imports mlflow; no code branches on a method or model-family name."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_capt_never_imports_the_orchestration_stack():
    offenders = {str(p.relative_to(ROOT)): _imports(p) & {"ray", "mlflow", "accelerate", "pipelines"}
                 for p in _sources("capt")}
    assert not {k: v for k, v in offenders.items() if v}


def test_only_the_tracking_package_imports_mlflow():
    importers = [str(p.relative_to(ROOT)) for p in _sources("pipelines") if "mlflow" in _imports(p)]
    assert importers and all(name.startswith("pipelines/tracking") and "spool" not in name for name in importers)


def test_model_family_knowledge_lives_in_capt_arch():
    for path in _sources("pipelines") + _sources("capt/tasks"):
        text = path.read_text()
        assert ".encoder.block" not in text and ".base_model.layers" not in text, path


# Method and family names may appear in `pipelines/` and `capt/` only as data (defaults, tables, labels),
# never as a branch: what differs between methods is a property of `capt.methods.MethodModel`, what differs
# between model families one of `capt.arch.ArchSpec`. `capt/arch` defines the families, `capt/methods.py`
# the method registry, and `capt/tasks` keys each task's prompt formats by family name.
_NAME_BRANCH_EXEMPT = ("capt/arch/", "capt/methods.py", "capt/tasks/")
_COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _branch_names() -> set[str]:
    from capt.arch import REGISTRY
    from capt.methods import METHODS

    return set(METHODS) | {spec.family for spec in REGISTRY}


def _string_constants(node: ast.AST) -> set[str]:
    """The string literals `node` is, or holds as a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_string_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def _pattern_constants(pattern: ast.pattern) -> set[str]:
    """The string literals a `match` case pattern matches (`case "capt":`, `case "t5" | "decoder":`)."""
    if isinstance(pattern, ast.MatchValue):
        return _string_constants(pattern.value)
    if isinstance(pattern, ast.MatchOr):
        return set().union(*(_pattern_constants(p) for p in pattern.patterns))
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _pattern_constants(pattern.pattern)
    return set()


def _dispatch_keys(node: ast.AST) -> set[str]:
    """Keys of a dict literal looked up on the spot (`{"capt": a, "lora": b}[name]` or `.get(name)`)."""
    if isinstance(node, ast.Subscript):
        target = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        target = node.func.value
    else:
        return set()
    if not isinstance(target, ast.Dict):
        return set()
    return set().union(*(_string_constants(k) for k in target.keys if k is not None))


def name_branches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison, `match` case or dict dispatch on one of `names` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hits: set[str] = set()
        if isinstance(node, ast.Compare) and any(isinstance(op, _COMPARISONS) for op in node.ops):
            hits = set().union(*(_string_constants(side) for side in [node.left, *node.comparators]))
        elif isinstance(node, ast.match_case):
            hits = _pattern_constants(node.pattern)
        else:
            hits = _dispatch_keys(node)
        line = node.pattern.lineno if isinstance(node, ast.match_case) else getattr(node, "lineno", 0)
        found += [(line, name) for name in sorted(hits & names)]
    return found


def test_no_branch_on_a_method_or_family_name():
    names = _branch_names()
    assert {"capt", "lora", "prompt_tuning", "t5", "decoder", "encoder"} <= names
    offenders = {}
    for path in _sources("pipelines") + _sources("capt"):
        relative = str(path.relative_to(ROOT))
        if not relative.startswith(_NAME_BRANCH_EXEMPT) and (hits := name_branches(path.read_text(), names)):
            offenders[relative] = hits
    assert not offenders, f"branch on a method or family name (make it a MethodModel/ArchSpec property): {offenders}"


@pytest.mark.parametrize("source", [
    'if method == "capt":\n    pass',
    'x = family != "decoder"',
    'x = "t5" == spec.family',
    'x = family in ("t5", "encoder")',
    'x = name not in ["lora"]',
    'match method:\n    case "prompt_tuning" | "other":\n        pass',
    'match family:\n    case "encoder" as e:\n        pass',
    'f = {"capt": a, "lora": b}[method]',
    'f = {"decoder": a}.get(family, b)',
])
def test_each_form_of_name_branch_is_found(source):
    assert name_branches(source, _branch_names()), source


@pytest.mark.parametrize("source", [
    'name = options.get("name", "capt")',
    'DEFAULTS = {("capt", "t5"): 1}',
    'x = spec.classifier_head and mode == "rank"',
    'for stack in ("encoder", "decoder"):\n    pass',
])
def test_names_as_data_are_not_branches(source):
    assert not name_branches(source, _branch_names()), source


# Lines of code fit 120 characters: wide enough for the long error messages and shapes the project writes, narrow
# enough for two files side by side. ruff's E501 checks the same limit (pyproject.toml) for those who run `make lint`.
LINE_LIMIT = 120


def test_every_line_of_code_fits_the_line_limit():
    long_lines = [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
                  for folder in ("capt", "pipelines", "tests", "benchmarks") for path in _sources(folder)
                  for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > LINE_LIMIT]
    assert not long_lines, f"lines over {LINE_LIMIT} characters (reflow them): {long_lines}"


def test_ruff_checks_the_same_line_limit():
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["line-length"] == LINE_LIMIT and "E501" not in ruff["lint"].get("ignore", [])
