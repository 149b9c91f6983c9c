"""Each seed begins as in a new process: the fleet's module-level objects get back their
first state, and read the simulator's clock."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from types import ModuleType

from toolfleet.testing.sim._fresh import as_new_process
from toolfleet.testing.sim._loop import SimLoop, virtual_time

LOG = """
import threading
import time


class Log:
    def __init__(self):
        self.windows = {}
        self.clock = time.monotonic
        self.lock = threading.Lock()


LOG = Log()
"""


def test_a_module_object_gets_back_its_first_state_before_each_seed(
    fleet_module: Callable[[str], ModuleType],
) -> None:
    module = fleet_module(LOG)
    lock = module.LOG.lock
    with as_new_process():
        module.LOG.windows["charge"] = 1.0
        module.LOG.later = "set in a seed"
    with as_new_process():
        assert module.LOG.windows == {}
        assert not hasattr(module.LOG, "later")
        assert module.LOG.lock is lock  # no copy of a lock: it stays


def test_a_module_object_reads_the_simulated_clock_while_a_seed_runs(
    fleet_module: Callable[[str], ModuleType],
) -> None:
    module = fleet_module(LOG)
    loop = SimLoop(random.Random(1))
    loop.now = 42.0
    try:
        with virtual_time(loop, 1):
            assert module.LOG.clock() == 42.0
    finally:
        loop.close()
    assert module.LOG.clock is time.monotonic
