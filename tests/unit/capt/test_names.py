"""`capt.slots.CapsuleSelector`: capsule names by index; a name routes a row to the first capsule of that name."""

from __future__ import annotations

import pytest

from capt.errors import CaptError
from capt.slots import CapsuleSelector


def test_a_name_routes_to_its_first_capsule_and_an_unknown_name_is_refused():
    selector = CapsuleSelector(["b", "a", "b"])
    selector.append("c")
    assert selector.names == ["b", "a", "b", "c"]
    assert [selector.position(name) for name in ("a", "b", "c", "d")] == [1, 0, 3, None]
    assert selector.rows(["c", "b", 1], batch=3, count=4).tolist() == [3, 0, 1]
    with pytest.raises(CaptError, match="Unknown capsule 'd'"):
        selector.rows(["d"], batch=1, count=4)
