"""Keep the tests that share a costly fixture on one pytest-xdist worker (`make test`: `-n 2 --dist loadgroup`).

Each xdist worker is a pytest session of its own: a module- or session-scoped fixture is built once per worker that
runs a test needing it. A module fixture that trains jobs, or the session's smoke sweep, would run again on every
worker. `--dist loadgroup` sends the tests of one `xdist_group` to one worker: so the tests that use a module
fixture form one group per module, and the tests that use a session fixture one group per fixture (a module where
some test uses one joins that group with all of its shared-fixture tests, so its module fixtures are built once too).

The integration tier's services (`PER_WORKER`) are left out: every worker has its own (ports and folders are picked
free), so tests on them may spread over the workers.
"""

from __future__ import annotations

import pytest

PER_WORKER = frozenset({"_service_pool", "mlflow_server", "ray_head"})
"""Session fixtures each worker builds for itself on purpose: the servers the integration tests share."""


def _shared_fixtures(item: pytest.Item, scope: str) -> list[str]:
    """Names of the fixtures of ``scope`` that the project's conftests or test modules define and ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    names = []
    for name, definitions in info.name2fixturedefs.items():
        definition = definitions[-1]
        defined_in_tests = bool(definition.baseid)  # pytest's own fixtures (tmp_path_factory, ...) have none
        if definition.scope == scope and defined_in_tests and name not in PER_WORKER:
            names.append(name)
    return sorted(names)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def assign_xdist_groups(items: list[pytest.Item]) -> None:
    """Mark every test that uses a shared fixture with the `xdist_group` of that fixture (see the module doc)."""
    session_group_of_module: dict[str, str] = {}
    for item in items:
        if session_fixtures := _shared_fixtures(item, "session"):
            session_group_of_module.setdefault(_module_of(item), session_fixtures[0])
    for item in items:
        if session_fixtures := _shared_fixtures(item, "session"):
            group = session_fixtures[0]
        elif _shared_fixtures(item, "module"):
            group = session_group_of_module.get(_module_of(item), _module_of(item))
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
