"""The simulator's event loop and clock: one seed, one order of everything.

``SimLoop`` is an asyncio loop that never waits for real time or real I/O. Of the callbacks
ready to run it runs one, picked by the seed's random generator, so the interleaving of every
task (services, tools, the broker's deliveries) follows from the seed alone; when nothing is
ready it jumps its clock to the next timer. ``virtual_time`` makes the clocks the fleet's code
reads (``time.time``, ``time.monotonic``, and the copies modules bound at import or their
objects hold) read that clock while a simulation runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import random
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVarTuple

EPOCH = 1_800_000_000.0
"""Where the simulated wall clock starts (a fixed instant: a replay reads the same times)."""

PACKAGES = ("kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet", "schemas")
"""The packages whose import-bound clocks ``virtual_time`` swaps (the fleet's own code)."""


_Ts = TypeVarTuple("_Ts")


class Stalled(Exception):
    """Nothing is ready and no timer is set: every task waits for something that never comes."""


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual and whose ready callbacks run in a seeded order."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.now = 0.0
        """Virtual seconds since the simulation began."""
        self.steps = 0
        """Callbacks run so far (a measure of the work a seed did)."""
        self.on_step: Callable[[], None] | None = None
        """Called before each callback (the simulator injects faults from there)."""
        self._timer_order = itertools.count()

    def time(self) -> float:
        """The virtual clock (asyncio's timers and timeouts read it)."""
        return self.now

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """A timer due at ``when``, after those due then that were set before it (asyncio
        leaves their order to the shape of its heap, which timers due at other instants change:
        a process's earlier seeds changed which of two services woke first)."""
        self._check_closed()  # type: ignore[attr-defined]
        timer = _Timer(when, callback, args, self, context)
        timer.order = next(self._timer_order)
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _run_once(self) -> None:
        # Adapted from asyncio.BaseEventLoop._run_once: no selector wait, the clock jumps to
        # the next timer, and one ready callback runs per iteration, chosen by the seed.
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        ready: Any = self._ready  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False
        if not ready and scheduled:
            self.now = max(self.now, scheduled[0]._when)
        while scheduled and scheduled[0]._when <= self.now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            if not handle._cancelled:
                ready.append(handle)
        if not ready:
            if self._stopping:  # type: ignore[attr-defined]
                return
            raise Stalled("no callback is ready and no timer is set")
        pick = self.rng.randrange(len(ready))
        ready.rotate(-pick)
        handle = ready.popleft()
        ready.rotate(pick)
        if handle._cancelled:
            return
        self.steps += 1
        if self.on_step is not None:
            self.on_step()
        handle._run()


class _Timer(asyncio.TimerHandle):
    """A timer ordered by when it is due, then by when it was set."""

    __slots__ = ("order",)
    order: int

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return (self.when(), self.order) < (other.when(), other.order)
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return (self.when(), self.order) <= (other.when(), other.order)
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        return _Timer.__lt__(other, self) if isinstance(other, _Timer) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return _Timer.__le__(other, self) if isinstance(other, _Timer) else NotImplemented


_REAL = {
    "time": time.time,
    "monotonic": time.monotonic,
    "perf_counter": time.perf_counter,
    "time_ns": time.time_ns,
    "monotonic_ns": time.monotonic_ns,
}


def _virtual(loop: SimLoop) -> dict[str, Callable[[], Any]]:
    return {
        "time": lambda: EPOCH + loop.now,
        "monotonic": lambda: loop.now,
        "perf_counter": lambda: loop.now,
        "time_ns": lambda: int((EPOCH + loop.now) * 1e9),
        "monotonic_ns": lambda: int(loop.now * 1e9),
    }


@contextmanager
def virtual_time(loop: SimLoop, seed: int) -> Iterator[None]:
    """While inside, every clock the fleet's code reads is ``loop``'s: the ``time`` module's
    functions, and the copies of them that the fleet's modules bound at import (module globals,
    functions' default arguments, attributes of module-level objects); ``random``'s global
    generator and ``uuid.uuid4`` draw from ``seed``. Restored on exit."""
    state = random.getstate()
    random.seed(seed)
    ids = random.Random(seed)
    real_uuid4 = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    fake = _virtual(loop)
    by_real = {id(real): fake[name] for name, real in _REAL.items()}
    undo: list[Callable[[], None]] = []
    for name, real in _REAL.items():
        setattr(time, name, fake[name])
        undo.append(lambda name=name, real=real: setattr(time, name, real))  # type: ignore[misc]
    for module in _fleet_modules():
        for attr, value in list(vars(module).items()):
            if id(value) in by_real:
                setattr(module, attr, by_real[id(value)])
                undo.append(lambda m=module, a=attr, v=value: setattr(m, a, v))  # type: ignore[misc]
            for function in _functions(value, module):
                undo.extend(_swap_defaults(function, by_real))
            if is_fleet_object(value):  # a module's object that read a clock when made
                for name, held in list(vars(value).items()):
                    if id(held) in by_real:
                        setattr(value, name, by_real[id(held)])
                        undo.append(lambda o=value, n=name, h=held: setattr(o, n, h))  # type: ignore[misc]
    try:
        yield
    finally:
        for step in reversed(undo):
            step()
        uuid.uuid4 = real_uuid4
        random.setstate(state)


def is_fleet_object(value: object) -> bool:
    """Whether ``value`` is an instance of one of the fleet's classes, with attributes."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType)):
        return False
    return hasattr(value, "__dict__") and type(value).__module__.split(".")[0] in PACKAGES


def _fleet_modules() -> list[types.ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and name.split(".")[0] in PACKAGES
    ]


def _functions(value: object, module: types.ModuleType) -> Iterator[types.FunctionType]:
    """The functions defined in ``module`` that ``value`` is or holds (a class's methods)."""
    if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
        yield value
    elif isinstance(value, type) and value.__module__ == module.__name__:
        for member in vars(value).values():
            inner = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if isinstance(inner, types.FunctionType):
                yield inner


def _swap_defaults(
    function: types.FunctionType, by_real: dict[int, Callable[[], Any]]
) -> list[Callable[[], None]]:
    undo: list[Callable[[], None]] = []
    defaults = function.__defaults__
    if defaults and any(id(d) in by_real for d in defaults):
        function.__defaults__ = tuple(by_real.get(id(d), d) for d in defaults)
        undo.append(lambda: setattr(function, "__defaults__", defaults))
    kwdefaults = function.__kwdefaults__
    if kwdefaults and any(id(d) in by_real for d in kwdefaults.values()):
        function.__kwdefaults__ = {k: by_real.get(id(d), d) for k, d in kwdefaults.items()}
        undo.append(lambda: setattr(function, "__kwdefaults__", kwdefaults))
    return undo
