"""The architecture's import rules: pipelines -> capt only; capt never imports ray, mlflow or accelerate;
only the tracking package imports mlflow."""

from __future__ import annotations

import ast
from pathlib import Path

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
