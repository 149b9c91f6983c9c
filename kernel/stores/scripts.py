"""The stores' Lua scripts: one file each, under ``kernel/stores/lua/<store>/``, read once.

A store takes its scripts at import (``script("ledger/begin")``) and registers them with its
Redis client (``Script.register``): redis-py runs a script by its SHA-1 (EVALSHA) and loads
it again when Redis has lost it. A script's file says which keys and arguments it takes;
``make lint`` runs luacheck on every file, and tests/unit/lua runs each script on a
redis-server of its own.

A piece of Lua shared by several scripts of a store lives in one file of its own, under the
store's ``lib/``. A script includes it with a line of its own::

    --@include lib/audit.lua

(a path from the including file's folder). The piece, after the pieces it includes, comes
before the script's text, once however often it is included. A piece defines local
functions; the scripts that call them name them for luacheck on the line after the include
(``-- luacheck: read globals keep``), and the piece names what it defines for others
(``-- luacheck: ignore 211/keep``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePosixPath
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from kernel.adapters.redis import register_durable_script
from kernel.errors import ToolfleetError

INCLUDE = re.compile(r"^--@include\s+(\S+)\s*$", re.MULTILINE)
"""An include line: ``--@include <path>``, the path from the including file's folder."""

LIBRARY = "lib"
"""The folder of a store's pieces (files that are included, never run on their own)."""


def _root() -> Traversable:
    return files("kernel.stores") / "lua"


@dataclass(frozen=True)
class Script:
    """One script as Redis runs it: its pieces, then its own text."""

    name: str
    """``<store>/<script>``, its file's path under ``kernel/stores/lua`` without ``.lua``."""
    source: str
    pieces: tuple[str, ...]
    """The pieces put before its text, in that order (paths under ``kernel/stores/lua``)."""

    @property
    def sha(self) -> str:
        """The SHA-1 Redis knows the script by (EVALSHA)."""
        return hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    def register(self, redis: Redis) -> AsyncScript:
        """The script, callable on ``redis`` (``await s(keys=[...], args=[...])``)."""
        return redis.register_script(self.source)

    def register_durable(self, redis: Redis) -> Callable[..., Awaitable[Any]]:
        """As ``register``; a run returns once the client's replicas have its writes
        (``kernel.adapters.redis.register_durable_script``)."""
        DURABLE.add(self.sha)
        return register_durable_script(redis, self.source)


DURABLE: set[str] = set()
"""The SHA-1s of the scripts registered durable in this process (the simulator's state server
replicates their writes before it answers, as WAIT makes a replicated Redis do)."""


@functools.cache
def script(name: str) -> Script:
    """The script ``kernel/stores/lua/<name>.lua`` with its pieces (read once per process)."""
    path = PurePosixPath(f"{name}.lua")
    if LIBRARY in path.parts:
        raise ToolfleetError(f"{name} is a piece of Lua, not a script: include it in one")
    pieces: list[str] = []
    _collect(path, pieces, ())
    texts = [_read(PurePosixPath(p)) for p in pieces]
    return Script(name, "".join([*texts, _read(path)]), tuple(pieces))


def _collect(path: PurePosixPath, into: list[str], within: tuple[str, ...]) -> None:
    """Append the pieces ``path`` includes to ``into``, each after what it includes."""
    for line in INCLUDE.findall(_read(path)):
        piece = path.parent / line
        if ".." in piece.parts or LIBRARY not in piece.parts:
            raise ToolfleetError(
                f"{path} includes {line}: include pieces from its store's {LIBRARY}/ folder"
            )
        if str(piece) in within:
            raise ToolfleetError(f"{path} includes {piece}, which includes {path} again")
        if str(piece) not in into:
            _collect(piece, into, (*within, str(path)))
            into.append(str(piece))


@functools.cache
def _read(path: PurePosixPath) -> str:
    file = _root().joinpath(*path.parts)
    if not file.is_file():
        raise ToolfleetError(f"no Lua file {path} under kernel/stores/lua: is the package whole?")
    text = file.read_text(encoding="utf-8")
    return text if text.endswith("\n") else text + "\n"


def names() -> list[str]:
    """Every script of every store (pieces left out), sorted: ``ledger/begin``, ..."""
    found: list[str] = []
    for store in _root().iterdir():
        if store.is_dir():
            found += [
                f"{store.name}/{f.name.removesuffix('.lua')}"
                for f in store.iterdir()
                if f.is_file() and f.name.endswith(".lua")
            ]
    return sorted(found)
