"""The scripts' loader (kernel/stores/scripts.py) and the scripts as a whole: each loads on
Redis, each has its tests here, and each piece it includes defines what it calls."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kernel.errors import ToolfleetError
from kernel.stores import scripts
from kernel.stores.scripts import names, script

LUA = Path(scripts.__file__).parent / "lua"
HERE = Path(__file__).parent


def test_every_script_loads_on_redis_under_its_sha(lua_client: redis.Redis) -> None:
    found = names()
    assert "ledger/begin" in found and "admission/admit" in found
    assert not [n for n in found if "/lib/" in n]  # pieces are not scripts
    assert lua_client.script_exists(*(script(n).sha for n in found)) == [True] * len(found)


def test_every_script_is_run_by_the_tests_of_this_folder() -> None:
    tests = "".join(p.read_text() for p in HERE.glob("test_*_scripts.py"))
    untested = [n for n in names() if f'"{n}"' not in tests]
    assert untested == [], f"scripts no test here runs: {untested}"


def _local_functions(text: str) -> set[str]:
    return set(re.findall(r"^local function (\w+)", text, flags=re.MULTILINE))


def _defined_by_includes(path: Path) -> set[str]:
    """The local functions of the pieces ``path`` includes, and of what they include."""
    found: set[str] = set()
    for line in scripts.INCLUDE.findall(path.read_text()):
        piece = path.parent / line
        found |= _local_functions(piece.read_text()) | _defined_by_includes(piece)
    return found


def _option(text: str, pattern: str) -> set[str]:
    return {n for line in re.findall(pattern, text, flags=re.MULTILINE) for n in line.split()}


def test_each_piece_defines_what_its_includers_name_for_the_linter() -> None:
    """luacheck sees one file at a time: an including file names what it calls from its
    pieces (``read globals``), a piece what it defines for them (``ignore 211/``). Both must
    be what the pieces define, or the linter would be told something untrue."""
    for path in sorted(LUA.rglob("*.lua")):
        text = path.read_text()
        name = path.relative_to(LUA).as_posix()
        included = _defined_by_includes(path)
        read = _option(text, r"^-- luacheck: read globals (.+)$")
        assert read <= included, f"{name} names {read - included}, which no piece defines"
        exported = {n.removeprefix("211/") for n in _option(text, r"^-- luacheck: ignore (.+)$")}
        if "lib" in path.parts:
            assert exported == _local_functions(text), name
        else:
            assert exported == set(), f"{name}: only pieces leave functions unused"


def test_a_script_puts_each_piece_once_before_its_own_text() -> None:
    admit = script("admission/admit")
    assert admit.pieces == (
        "admission/lib/bucket.lua", "admission/lib/chunks.lua", "admission/lib/enqueue.lua",
    )  # fmt: skip
    assert admit.source.count("local function each(") == 1  # admit and enqueue include it
    own = (LUA / "admission" / "admit.lua").read_text()
    assert admit.source.endswith(own)
    assert admit.source.startswith((LUA / "admission" / "lib" / "bucket.lua").read_text())
    assert script("ledger/begin").pieces == ()


@pytest.fixture
def lua_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Scripts read from ``tmp_path`` instead of the package's folder."""
    monkeypatch.setattr(scripts, "_root", lambda: tmp_path)
    scripts.script.cache_clear()
    scripts._read.cache_clear()
    yield tmp_path
    scripts.script.cache_clear()
    scripts._read.cache_clear()


def _write(root: Path, name: str, text: str) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


def test_pieces_come_after_what_they_include(lua_root: Path) -> None:
    _write(lua_root, "s/lib/a.lua", "local function a() end\n")
    _write(lua_root, "s/lib/b.lua", "--@include a.lua\nlocal function b() a() end\n")
    _write(lua_root, "s/run.lua", "--@include lib/b.lua\n--@include lib/a.lua\nreturn b()")
    run = script("s/run")
    assert run.pieces == ("s/lib/a.lua", "s/lib/b.lua")
    assert run.source.endswith("return b()\n")
    assert names() == ["s/run"]


def test_a_script_that_includes_itself_again_or_outside_lib_is_refused(lua_root: Path) -> None:
    _write(lua_root, "s/lib/a.lua", "--@include b.lua\n")
    _write(lua_root, "s/lib/b.lua", "--@include a.lua\n")
    _write(lua_root, "s/loop.lua", "--@include lib/a.lua\n")
    _write(lua_root, "s/other.lua", "--@include loop.lua\n")
    with pytest.raises(ToolfleetError, match=re.escape("includes s/lib/a.lua, which includes")):
        script("s/loop")
    with pytest.raises(ToolfleetError, match="include pieces from its store's lib/ folder"):
        script("s/other")


def test_a_missing_script_or_a_piece_run_as_a_script_says_what_is_wrong(lua_root: Path) -> None:
    _write(lua_root, "s/lib/a.lua", "local function a() end\n")
    with pytest.raises(ToolfleetError, match=re.escape("no Lua file s/nope.lua")):
        script("s/nope")
    with pytest.raises(ToolfleetError, match="is a piece of Lua, not a script"):
        script("s/lib/a")
