"""Several versions of one tool: their order, the registry, and where new calls go."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from redis.asyncio import Redis

from executors import ToolRegistry
from kernel.errors import ConfigurationError, ToolNotFoundError
from kernel.rules.versions import (
    VersionChoice,
    choose_version,
    circuits_to_check,
    newest_version,
    version_order,
)
from kernel.settings import Settings
from kernel.stores.door import Stores
from kernel.stores.registry import ToolCatalog
from planner import ApprovalView, plan_turn
from planner.service import Planner
from schemas import ModelResponseEvent, ToolSpec
from toolfleet.testing import InMemoryBus


# --- ordering -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("versions", "ordered"),
    [
        (["10", "9", "1"], ["1", "9", "10"]),  # numbers, not strings
        (["2", "1", "2"], ["1", "2"]),  # each once
        (["1", "01", "001"], ["001", "01", "1"]),  # equal numbers: the string decides
        (["1.10", "1.9", "2"], ["1.10", "1.9", "2"]),  # not all digits: strings
        (["10", "9", "beta"], ["10", "9", "beta"]),  # one non-number makes them all strings
        (["²", "1"], ["1", "²"]),  # isdigit but not a number int() reads: strings
        ([], []),
    ],
)
def test_versions_are_ordered_numerically_only_when_all_are_numbers(
    versions: list[str], ordered: list[str]
) -> None:
    assert version_order(versions) == ordered
    if ordered:
        assert newest_version(versions) == ordered[-1]


def test_there_is_no_newest_of_no_versions() -> None:
    with pytest.raises(ValueError, match="no versions"):
        newest_version([])


# --- the worker's registry ------------------------------------------------------------------
async def _noop() -> str:
    return "ok"


def test_registry_serves_several_versions_of_one_tool_side_by_side() -> None:
    tools = ToolRegistry()
    v9 = tools.tool(name="pay", version="9")(_noop)
    v10 = tools.tool(name="pay", version="10", pool="gpu")(_noop)
    other = tools.tool(name="refund")(_noop)
    assert tools.get("pay") is v10 and tools.find("pay") is v10  # newest: 10 > 9
    assert tools.get("pay", "9") is v9 and tools.find("pay", "10") is v10
    assert tools.get("pay", None) is v10
    assert tools.versions("pay") == ["9", "10"] and tools.versions("missing") == []
    assert "pay" in tools and "pay@9" not in tools
    assert list(tools) == [v9, v10, other] and len(tools) == 3
    assert [(t.name, t.version) for t in tools.for_pool("gpu")] == [
        ("pay", "9"), ("pay", "10"), ("refund", "1"),
    ]  # fmt: skip
    assert [(s.name, s.version) for s in tools.specs("default")] == [("pay", "9"), ("refund", "1")]


def test_registry_refuses_the_same_version_twice_and_names_a_missing_version() -> None:
    tools = ToolRegistry()
    tools.tool(name="pay", version="1")(_noop)
    tools.tool(name="pay", version="2")(_noop)
    with pytest.raises(ConfigurationError, match=r"'pay' version '2' is declared twice"):
        tools.tool(name="pay", version="2")(_noop)
    with pytest.raises(ToolNotFoundError, match=r"^Tool 'pay' version '3' not found\.$"):
        tools.get("pay", "3")
    with pytest.raises(ToolNotFoundError, match=r"^Tool 'other' not found\.$"):
        tools.get("other", "1")
    assert tools.find("pay", "3") is None and tools.find("other") is None


# --- where new calls go ---------------------------------------------------------------------
def choose(live: Iterable[str], open_versions: Iterable[str] = (), **given: Any) -> VersionChoice:
    return choose_version("pay", live, {f"pay@{v}" for v in open_versions}, **given)


def test_new_calls_go_to_the_newest_healthy_version() -> None:
    assert choose(["1", "2"]) == VersionChoice("pay", "2", "newest")
    assert choose(["2"]) == VersionChoice("pay", "2", "newest")
    assert choose(["9", "10"], open_versions=["9"]).version == "10"  # an older one failing


def test_an_open_newest_version_rolls_back_to_the_newest_healthy_earlier_one() -> None:
    assert choose(["1", "2", "3"], open_versions=["3"]) == VersionChoice(
        "pay", "2", "rolled_back", passed_over=("3",)
    )
    assert choose(["1", "2", "3"], open_versions=["3", "2"]) == VersionChoice(
        "pay", "1", "rolled_back", passed_over=("3", "2")
    )
    assert choose(["9", "10"], open_versions=["10"]).version == "9"  # numeric order


def test_when_every_version_is_open_the_newest_is_chosen_and_its_workers_refuse() -> None:
    assert choose(["1", "2"], open_versions=["1", "2"]) == VersionChoice("pay", "2", "all_open")
    assert choose(["2"], open_versions=["2"]) == VersionChoice("pay", "2", "all_open")


def test_without_automatic_rollback_the_newest_is_chosen_even_when_open() -> None:
    choice = choose(["1", "2"], open_versions=["2"], auto_rollback=False)
    assert choice == VersionChoice("pay", "2", "newest") and not choice.explicit


def test_a_live_pin_wins_over_circuits_and_automatic_rollback() -> None:
    assert choose(["1", "2"], pin="1") == VersionChoice("pay", "1", "pinned")
    assert choose(["1", "2"], open_versions=["2"], pin="2").route == "pinned"  # refused there
    assert choose(["1", "2"], pin="1", auto_rollback=False).version == "1"


def test_a_pin_to_a_version_that_is_not_live_is_ignored_and_said_so() -> None:
    choice = choose(["1", "2"], open_versions=["2"], pin="7")
    assert (choice.version, choice.route, choice.ignored_pin) == ("1", "rolled_back", "7")
    assert "the pin to 7 is ignored" in choice.describe()


def test_only_a_pin_or_a_rollback_makes_commands_name_their_version() -> None:
    # The newest carries no version: a worker still on the previous release runs what it has.
    assert [choose(["1", "2"], open_versions=o, pin=p).explicit for o, p in [
        ((), None), (["2"], None), (["1", "2"], None), ((), "2"),
    ]] == [False, True, False, True]  # fmt: skip


def test_the_reason_names_the_chosen_and_the_failing_versions() -> None:
    assert choose(["1", "2"]).describe() == "pay@2: the newest live version"
    assert choose(["1", "2"], pin="1").describe() == "pay@1: pinned by an operator"
    assert choose(["1", "2", "3"], open_versions=["3", "2"]).describe() == (
        "pay@1: automatic rollback, the circuit of pay@3, pay@2 is open"
    )
    assert "every live version's circuit is open" in choose(["1"], ["1"]).describe()


def test_there_is_nothing_to_route_to_without_a_live_version() -> None:
    with pytest.raises(ValueError, match="no live version"):
        choose([])


def test_circuits_are_read_only_when_they_can_change_the_choice() -> None:
    assert circuits_to_check("pay", ["2", "1"]) == ["pay@1", "pay@2"]
    assert circuits_to_check("pay", ["1"]) == []  # a single version: it is the one
    assert circuits_to_check("pay", ["1", "2"], pin="1") == []  # a live pin decides
    assert circuits_to_check("pay", ["1", "2"], pin="7") == ["pay@1", "pay@2"]
    assert circuits_to_check("pay", ["1", "2"], auto_rollback=False) == []


# --- the plan records the version -----------------------------------------------------------
def spec(version: str, pool: str = "default", **fields: Any) -> ToolSpec:
    return ToolSpec(name="pay", version=version, pool=pool, parameters={}, **fields)


def response(*names: str) -> ModelResponseEvent:
    items = [
        {"type": "function_call", "call_id": f"c{i}", "name": n, "arguments": "{}"}
        for i, n in enumerate(names)
    ]
    return ModelResponseEvent.model_validate(
        {"tenant_id": "t1", "run_id": "r1", "turn_id": 0, "agent": {"name": "a"},
         "response_id": "resp", "items": items}
    )  # fmt: skip


def test_dispatched_calls_of_a_routed_tool_name_the_version_and_use_its_spec() -> None:
    tools = {"pay": spec("1", pool="old"), "log": ToolSpec(name="log", pool="p", parameters={})}
    result = plan_turn(
        response("pay", "log"),
        tools=tools,
        ledger={},
        approvals=ApprovalView(),
        now=0.0,
        routes={"pay": "1"},
    )
    assert [(d.call.tool_version, d.call.pool) for d in result.dispatch] == [
        ("1", "old"), (None, "p"),
    ]  # fmt: skip
    assert [c.tool_version for c in result.plan.calls] == ["1", None]
    assert [u.call.tool_version for u in result.ledger_updates] == ["1", None]


def test_a_call_waiting_for_approval_names_no_version_until_it_is_dispatched() -> None:
    result = plan_turn(
        response("pay"),
        tools={"pay": spec("1", needs_approval="always")},
        ledger={},
        approvals=ApprovalView(),
        now=0.0,
        routes={"pay": "1"},
    )
    assert [(c.disposition, c.tool_version) for c in result.plan.calls] == [("interrupt", None)]


# --- the planner's routing step -------------------------------------------------------------
class _Directory:
    def __init__(self, catalog: ToolCatalog) -> None:
        self.catalog_ = catalog

    async def catalog(self, needed: Iterable[str] = ()) -> ToolCatalog:
        return self.catalog_


class _Circuits:
    def __init__(self, opened: set[str]) -> None:
        self.opened = opened
        self.reads: list[list[str]] = []

    async def open_among(self, refs: Iterable[str]) -> set[str]:
        wanted = list(refs)
        self.reads.append(wanted)
        return self.opened & set(wanted)


def _planner(catalog: ToolCatalog, opened: set[str], **settings: Any) -> tuple[Planner, _Circuits]:
    own = Settings(**settings)
    # Never connects: nothing is sent.
    planner = Planner(own, bus=InMemoryBus(settings=own), stores=Stores(Redis(), own))
    circuits = _Circuits(opened)
    planner.tools = _Directory(catalog)  # type: ignore[assignment]
    planner.circuits = circuits  # type: ignore[assignment]
    return planner, circuits


LOG = ToolSpec(name="log", pool="default", parameters={})
TWO = ToolCatalog(
    specs={"pay": spec("2"), "log": LOG},
    versions={"pay": {"1": spec("1", pool="old"), "2": spec("2")}, "log": {"1": LOG}},
)


async def test_the_planner_reads_no_circuit_for_tools_without_a_choice() -> None:
    planner, circuits = _planner(TWO, opened={"log@1"})
    specs, routes = await planner._routed(["log", "log"])
    assert (specs, routes, circuits.reads) == (TWO.specs, {}, [])


async def test_the_planner_reads_the_circuits_once_per_turn_and_rolls_back() -> None:
    planner, circuits = _planner(TWO, opened={"pay@2"})
    specs, routes = await planner._routed(["pay", "log", "pay"])
    assert routes == {"pay": "1"} and specs["pay"].pool == "old" and specs["log"] is LOG
    assert circuits.reads == [["pay@1", "pay@2"]]
    assert TWO.specs["pay"].version == "2"  # the directory's cached view is left alone


async def test_the_planner_routes_to_the_newest_without_naming_it_while_it_is_healthy() -> None:
    planner, _ = _planner(TWO, opened=set())
    assert await planner._routed(["pay"]) == (TWO.specs, {})


async def test_the_planner_follows_a_pin_without_reading_circuits() -> None:
    pinned = ToolCatalog(TWO.specs, TWO.versions, pins={"pay": "1"})
    planner, circuits = _planner(pinned, opened={"pay@1"})
    specs, routes = await planner._routed(["pay"])
    assert (routes, specs["pay"].version, circuits.reads) == ({"pay": "1"}, "1", [])


async def test_automatic_rollback_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_AUTO_ROLLBACK", "false")
    planner, circuits = _planner(TWO, opened={"pay@2"})
    assert planner.settings.auto_rollback is False
    assert await planner._routed(["pay"]) == (TWO.specs, {})
    assert circuits.reads == []
