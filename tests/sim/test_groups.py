"""The simulator's fewer slot groups: every copy of the names follows, or it refuses."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from kernel.stores import keys, ledger, reconciling
from toolfleet.testing.sim._groups import SlotGroupsError, slot_groups


def test_every_copy_holds_the_simulated_groups_inside_and_the_real_ones_after(
    fleet_module: Callable[[str], ModuleType],
) -> None:
    aliased = fleet_module(
        "from kernel.stores.keys import SLOT_GROUPS as N, GROUP_TAGS\n"
        "def groups():\n    return list(range(N))\n",
    )
    real, tags = keys.SLOT_GROUPS, keys.GROUP_TAGS
    with slot_groups(4):
        assert keys.SLOT_GROUPS == ledger.SLOT_GROUPS == reconciling.SLOT_GROUPS == 4
        assert aliased.groups() == [0, 1, 2, 3]
        assert keys.GROUP_TAGS == aliased.GROUP_TAGS == tags[:4]
        assert {keys.Keys().group(f"t{n}", "run") for n in range(50)} == {0, 1, 2, 3}
    assert keys.SLOT_GROUPS == ledger.SLOT_GROUPS == aliased.N == real
    assert keys.GROUP_TAGS is aliased.GROUP_TAGS is tags


def test_a_module_that_derives_a_value_at_import_is_refused(
    fleet_module: Callable[[str], ModuleType],
) -> None:
    fleet_module("from kernel.stores import keys\nALL = tuple(range(keys.SLOT_GROUPS))\n")
    real = keys.SLOT_GROUPS
    with pytest.raises(SlotGroupsError, match=r"module\.py:2 reads SLOT_GROUPS"), slot_groups(4):
        pass
    assert ledger.SLOT_GROUPS == keys.SLOT_GROUPS == real  # nothing was changed


def test_a_default_argument_is_read_at_import_too(
    fleet_module: Callable[[str], ModuleType],
) -> None:
    fleet_module(
        "from kernel.stores.keys import SLOT_GROUPS\n"
        "def scan(groups=SLOT_GROUPS):\n    return groups\n",
    )
    refused = pytest.raises(SlotGroupsError, match="reads SLOT_GROUPS or GROUP_TAGS at import")
    with refused, slot_groups(4):
        pass
