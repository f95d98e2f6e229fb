"""House rules on imports, as tests: no import cycle anywhere in capt/ or pipelines/ (imports inside functions
count: a cycle hidden in a function is still a cycle), and the configuration package imports no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_names(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} for every module of `package` under `root` (a package is its __init__)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement reaches: `from a.b import c` reaches a.b.c (a module) or a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: modules of `packages` it imports anywhere in its file}, each name cut to its longest module."""
    modules = {}
    for package in packages:
        modules.update(_module_names(root, package))
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node, name, is_package):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                elif successor in stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_in_capt_or_pipelines():
    found = cycles(import_graph(ROOT, ("capt", "pipelines")))
    assert not found, "import cycles (imports inside functions count): " + "; ".join(" <-> ".join(c) for c in found)


MAX_FLOOR = 8
"""Issue #53's bound on pipelines/'s layering: a module's floor is one above the highest pipelines module it imports
(anywhere in its file); the entry points sit at most this high."""


def floors(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{module: its longest import chain, itself first}; the chain's length is the module's floor (no cycles here)."""
    chains: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in chains:
            below = [chain(target) for target in sorted(graph[module])]
            chains[module] = [module, *max(below, key=len, default=[])]
        return chains[module]

    for module in graph:
        chain(module)
    return chains


def test_pipelines_stands_on_at_most_eight_floors():
    chains = floors(import_graph(ROOT, ("pipelines",)))
    highest = max(chains.values(), key=len)
    assert len(highest) <= MAX_FLOOR, f"{len(highest)} floors: " + " -> ".join(highest)


def test_floors_count_the_longest_chain(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text("import pkg.c\nfrom pkg import d\n")
    (package / "c.py").write_text("from pkg.d import x\n")
    (package / "d.py").write_text("x = 1\n")
    chains = floors(import_graph(tmp_path, ("pkg",)))
    assert chains["pkg.a"] == ["pkg.a", "pkg.b", "pkg.c", "pkg.d"] and len(chains["pkg.d"]) == 1


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "sub" / "c.py").write_text("def g():\n    from pkg import a\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def test_the_configuration_package_imports_no_torch():
    modules = sorted(m for m in _module_names(ROOT, "pipelines") if m.startswith("pipelines.config"))
    heavy = ("torch", "transformers", "accelerate", "ray", "mlflow")
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pipelines.config.load" in modules and done.stdout.strip() == "[]", done.stdout


def test_a_training_job_knows_no_tracker():
    """`pipelines/training/` imports nothing from `pipelines/tracking/`: a job reports through the callbacks it is
    handed, and tracking wraps it (`pipelines.tracking.jobs`). The entry point
    `pipelines.train` wires the two together, through `pipelines.tracking.job_cli` only."""
    graph = import_graph(ROOT, ("pipelines",))

    def tracking(module: str) -> list[str]:
        return sorted(t for t in graph[module] if t == "pipelines.tracking" or t.startswith("pipelines.tracking."))

    assert {m: tracking(m) for m in graph if m.startswith("pipelines.training") and tracking(m)} == {}
    assert tracking("pipelines.train") == ["pipelines.tracking.job_cli"]
