"""SlotGroupBatches: the requests of one event-loop turn written together, per slot group."""

from __future__ import annotations

import asyncio

import pytest

from kernel.adapters.redis import SlotGroupBatches


class Recorder:
    """A write that records each batch it is given and replies with each item doubled."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        if self.fail:
            raise ConnectionError("redis away")
        return [2 * item for item in items]


async def test_requests_of_one_loop_turn_are_one_write_on_a_single_server() -> None:
    write = Recorder()
    batches = SlotGroupBatches(write, per_slot_group=False)
    replies = await asyncio.gather(*(batches.submit(group, n) for n, group in enumerate([3, 7, 3])))
    assert replies == [0, 2, 4]
    assert write.batches == [[0, 1, 2]]


async def test_on_a_cluster_each_slot_group_is_a_write_of_its_own() -> None:
    write = Recorder()
    batches = SlotGroupBatches(write, per_slot_group=True)
    replies = await asyncio.gather(*(batches.submit(group, n) for n, group in enumerate([3, 7, 3])))
    assert replies == [0, 2, 4]
    assert sorted(write.batches) == [[0, 2], [1]]


async def test_requests_of_later_loop_turns_are_later_writes() -> None:
    write = Recorder()
    batches = SlotGroupBatches(write, per_slot_group=False)
    assert await batches.submit(0, 1) == 2
    assert await batches.submit(0, 2) == 4
    assert write.batches == [[1], [2]]


async def test_a_failed_write_fails_every_caller_of_its_batch_and_no_other() -> None:
    write = Recorder(fail=True)
    batches = SlotGroupBatches(write, per_slot_group=False)
    first = [batches.submit(0, n) for n in range(3)]
    for reply in first:
        with pytest.raises(ConnectionError):
            await reply
    write.fail = False
    assert await batches.submit(0, 5) == 10


async def test_a_caller_that_gave_up_does_not_stop_the_others_getting_their_replies() -> None:
    write = Recorder()
    batches = SlotGroupBatches(write, per_slot_group=False)
    gone, kept = batches.submit(0, 1), batches.submit(0, 2)
    gone.cancel()
    assert await kept == 4
    assert write.batches == [[1, 2]]
