"""The history's scripts (kernel/stores/lua/history/), each on its own: put writes an entry
and its indexes once however often it runs, moves a rewritten entry, keeps a later write
and refuses a stale one; link adds deciders and resolutions; search walks the smallest
index within its bounds and budget; every write trims what aged out, a bounded amount."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tests.unit.lua.conftest import Lua

ENTRY, MARKS = "e", "marks"
US, RS = "\x1f", "\x1e"
DAY_MS = 86_400_000


def member(ms: int, ident: str = "r1\x1f0", code: str = "T") -> str:
    return f"{ms:013d}{US}{code}{US}{ident}"


def put(
    lua: Lua,
    mem: str,
    indexes: Sequence[str],
    *,
    before: Sequence[str] = (),
    read: tuple[str, str, str] = ("", "", ""),
    seq: str = "1",
    entry: str = ENTRY,
    guards: Sequence[tuple[str, str]] = (),
    fields: Sequence[tuple[str, str]] = (("doc", "{}"),),
    marks: Sequence[tuple[str, str]] = (),
    cutoff: str = "",
    budget: int = 16,
    ttl_ms: int = DAY_MS,
) -> str:
    """put.lua as History.put runs it: ``before`` the indexes the entry was in, ``read`` its
    seq, by and res as read."""
    args: list[str | int] = [seq, mem, ttl_ms, cutoff, budget, len(indexes), *read, len(guards)]
    for pair in guards:
        args += list(pair)
    args.append(len(fields))
    for pair in fields:
        args += list(pair)
    args.append(len(marks))
    for pair in marks:
        args += list(pair)
    reply: bytes = lua("history/put", [entry, MARKS, *indexes, *before], args)
    return reply.decode()


def members(r: redis.Redis, key: str) -> list[str]:
    return [_text(m) for m in r.zrange(key, 0, -1)]


def _text(value: object) -> str:
    assert isinstance(value, bytes), value
    return value.decode()


def test_an_entry_is_written_and_indexed_once_however_often_it_is_put(
    lua: Lua, r: redis.Redis
) -> None:
    m = member(1_000)
    assert put(lua, m, ["ix:kind", "ix:run"], fields=[("doc", '{"a":1}')]) == "written"
    for _ in range(2):  # a redelivered message, read as the entry is now
        again = put(lua, m, ["ix:kind", "ix:run"], before=["ix:kind", "ix:run"],
                    read=("1", "", ""), fields=[("doc", '{"a":1}')])  # fmt: skip
        assert again == "written"
    assert members(r, "ix:kind") == members(r, "ix:run") == [m]
    assert r.hget(ENTRY, "doc") == b'{"a":1}'
    assert r.hget(ENTRY, "m") == m.encode()
    assert 0 < r.pttl(ENTRY) <= DAY_MS and 0 < r.pttl("ix:kind") <= DAY_MS


def test_a_later_write_moves_the_entry_and_an_earlier_one_changes_nothing(
    lua: Lua, r: redis.Redis
) -> None:
    first, later = member(1_000), member(2_000)
    assert put(lua, first, ["ix:kind", "ix:status:interrupted"], seq="1") == "written"
    moved = put(lua, later, ["ix:kind", "ix:status:completed"], seq="2", read=("1", "", ""),
                before=["ix:kind", "ix:status:interrupted"])  # fmt: skip
    assert moved == "written"
    assert members(r, "ix:kind") == [later]
    assert members(r, "ix:status:interrupted") == []  # it is not interrupted any more
    assert members(r, "ix:status:completed") == [later]
    # The earlier result, redelivered: the entry keeps the later one.
    assert put(lua, first, ["ix:kind", "ix:status:interrupted"], seq="1") == "older"
    assert members(r, "ix:kind") == [later] and members(r, "ix:status:interrupted") == []


def test_a_write_built_from_an_entry_that_changed_meanwhile_is_refused(
    lua: Lua, r: redis.Redis
) -> None:
    put(lua, member(1), ["ix:kind"])
    r.hset(ENTRY, "by", "call_1\x1falice")  # a link since the caller read it
    assert put(lua, member(1), ["ix:kind"], read=("1", "", "")) == "stale"
    assert put(lua, member(1), ["ix:kind"], read=("1", "call_1\x1falice", "")) == "written"


def test_a_write_built_from_marks_that_changed_meanwhile_is_refused(
    lua: Lua, r: redis.Redis
) -> None:
    r.hset(MARKS, "d\x1fcall_1", "alice")
    stale = put(lua, member(1), ["ix:kind"], guards=[("d\x1fcall_1", "")])
    assert stale == "stale" and not r.exists(ENTRY) and not r.exists("ix:kind")
    fresh = put(
        lua, member(1), ["ix:kind"], guards=[("d\x1fcall_1", "alice")],
        marks=[("c\x1fcall_1", "r1\x1f0")],
    )  # fmt: skip
    assert fresh == "written"
    assert r.hget(MARKS, "c\x1fcall_1") == b"r1\x1f0"


def test_each_write_trims_at_most_its_budget_of_members_older_than_the_cutoff(
    lua: Lua, r: redis.Redis
) -> None:
    r.zadd("ix:kind", {member(ms, f"old{ms}"): 0 for ms in range(10)})
    cutoff = f"{5:013d}"  # members of ms 0-4 are older than the retention
    put(lua, member(100), ["ix:kind"], cutoff=cutoff, budget=3)
    assert len(members(r, "ix:kind")) == 11 - 3
    put(lua, member(101, "r2\x1f0"), ["ix:kind"], entry="e2", cutoff=cutoff, budget=3)
    kept = members(r, "ix:kind")
    assert [int(m[:13]) for m in kept] == [5, 6, 7, 8, 9, 100, 101]


def test_an_entry_kept_for_ever_has_no_expiry(lua: Lua, r: redis.Redis) -> None:
    put(lua, member(1), ["ix:kind"], ttl_ms=0)
    assert r.pttl(ENTRY) == -1 and r.pttl("ix:kind") == -1


def link(
    lua: Lua,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
    *,
    call: str = "",
    decider: str = "",
    fields: Sequence[tuple[str, str]] = (),
) -> str:
    """link.lua as History.link runs it."""
    args: list[str | int] = [DAY_MS, "", 16, len(add), call, decider]
    for pair in fields:
        args += list(pair)
    reply: bytes = lua("history/link", [ENTRY, *add, *remove], args)
    return reply.decode()


def test_link_notes_each_calls_latest_decider_and_indexes_the_entry(
    lua: Lua, r: redis.Redis
) -> None:
    m = member(7)
    put(lua, m, ["ix:kind"])
    assert link(lua, ["ix:decider:alice"], call="call_1", decider="alice") == "linked"
    assert link(lua, ["ix:decider:bob"], call="call_2", decider="bob") == "linked"
    assert link(lua, ["ix:decider:carol"], ["ix:decider:alice"], call="call_1",
                decider="carol") == "linked"  # fmt: skip
    by = _text(r.hget(ENTRY, "by"))
    assert sorted(by.split(RS)) == ["call_1\x1fcarol", "call_2\x1fbob"]
    assert members(r, "ix:decider:carol") == members(r, "ix:decider:bob") == [m]
    assert members(r, "ix:decider:alice") == []
    # A rewrite that moves the entry takes it out of every index it was in.
    was_in = ["ix:kind", "ix:decider:bob", "ix:decider:carol"]
    put(lua, member(8), ["ix:kind"], before=was_in, read=("1", by, ""), seq="2")
    assert members(r, "ix:decider:carol") == [] and members(r, "ix:kind") == [member(8)]


def test_link_keeps_fields_for_an_entry_not_written_yet(lua: Lua, r: redis.Redis) -> None:
    assert link(lua, ["ix:status:resolved"], fields=[("res", '{"by":"x"}')]) == "missing"
    assert r.hget(ENTRY, "res") == b'{"by":"x"}' and not r.exists("ix:status:resolved")
    assert 0 < r.pttl(ENTRY) <= DAY_MS


def search(
    lua: Lua, keys: Sequence[str], *, upper: str = "+", lower: str = "-", want: int = 10,
    budget: int = 100,
) -> tuple[str, int, bool, list[str]]:  # fmt: skip
    """search.lua as History.search runs it."""
    reply = lua("history/search", keys, [upper, lower, want, budget])
    last, looked, done, *found = reply
    return last.decode(), int(looked), int(done) == 1, [f.decode() for f in found]


def test_search_finds_members_in_every_index_newest_first(lua: Lua, r: redis.Redis) -> None:
    every = [member(ms, f"r{ms}\x1f0") for ms in range(1, 21)]
    r.zadd("ix:kind", dict.fromkeys(every, 0))
    r.zadd("ix:tool", dict.fromkeys(every[::2], 0))  # odd ms
    r.zadd("ix:run", dict.fromkeys(every[::3], 0))
    last, looked, done, found = search(lua, ["ix:kind", "ix:tool", "ix:run"])
    assert found == [every[i] for i in (18, 12, 6, 0)]  # in all three, newest first
    assert done and last == every[0]
    assert looked == 7  # the run's index was walked: the smallest


def test_search_stops_at_what_it_wants_or_its_budget_and_says_where(
    lua: Lua, r: redis.Redis
) -> None:
    every = [member(ms, f"r{ms}\x1f0") for ms in range(1, 101)]
    r.zadd("ix:kind", dict.fromkeys(every, 0))
    last, looked, done, found = search(lua, ["ix:kind"], want=5)
    assert found == every[:-6:-1] and last == every[-5] and not done and looked == 5
    r.zadd("ix:rare", {every[9]: 0, every[50]: 0, every[51]: 0, every[52]: 0, every[90]: 0})
    r.zadd("ix:kind2", dict.fromkeys(every, 0))
    # The rare index is the smaller one, but its member must be in the other one too.
    r.zrem("ix:kind2", every[51])
    last, looked, done, found = search(lua, ["ix:kind2", "ix:rare"], want=10, budget=3)
    assert (found, looked, done) == ([every[90], every[52]], 3, False)
    assert last == every[51]
    last, looked, done, found = search(
        lua, ["ix:kind2", "ix:rare"], upper="(" + last, want=10, budget=3
    )
    assert (found, done) == ([every[50], every[9]], True)


def test_search_keeps_to_its_bounds(lua: Lua, r: redis.Redis) -> None:
    every = [member(ms, f"r{ms}\x1f0") for ms in range(1, 11)]
    r.zadd("ix:kind", dict.fromkeys(every, 0))
    upper, lower = "(" + f"{8:013d}", "[" + f"{3:013d}"  # ms 3 to 7
    _last, _looked, done, found = search(lua, ["ix:kind"], upper=upper, lower=lower)
    assert [int(m[:13]) for m in found] == [7, 6, 5, 4, 3] and done
    _last, looked, done, found = search(lua, ["ix:kind", "ix:none"])
    assert (found, looked, done) == ([], 0, True)  # an empty index: nothing to walk
