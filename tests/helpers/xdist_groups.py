"""Keep the tests that share a costly fixture on one pytest-xdist worker (under `--dist loadgroup`).

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


def _join_group(item: pytest.Item, group: str, config: pytest.Config) -> None:
    """Mark ``item`` with ``group``; on an xdist worker under `--dist loadgroup`, also give it the group suffix.

    pytest-xdist 3.8 tells the scheduler an item's group by appending ``@group`` to ``item._nodeid``, which pytest 9.2
    no longer reads (its node ids are structured, ``item._id``): every group would silently be split over the workers
    (pytest-xdist issue 1386). Until xdist writes the structured id itself, this does; where it does, its own suffix
    repeats the group and the scheduler (which reads the text after the last ``@``) sees the same group.
    """
    item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "loadgroup", False) and hasattr(item, "_id"):  # set on xdist workers only
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def assign_xdist_groups(items: list[pytest.Item], config: pytest.Config) -> None:
    """Put every test that uses a shared fixture in the `xdist_group` of that fixture (see the module doc)."""
    session_group_of_module: dict[str, str] = {}
    for item in items:
        if session_fixtures := _shared_fixtures(item, "session"):
            session_group_of_module.setdefault(_module_of(item), session_fixtures[0])
    for item in items:
        if session_fixtures := _shared_fixtures(item, "session"):
            _join_group(item, session_fixtures[0], config)
        elif _shared_fixtures(item, "module"):
            _join_group(item, session_group_of_module.get(_module_of(item), _module_of(item)), config)
