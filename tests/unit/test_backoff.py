"""The one backoff policy: capped exponential delays with equal jitter, on tenacity."""

from __future__ import annotations

import asyncio
import time

import pytest

from kernel.adapters.backoff import (
    DEPENDENCY,
    MESSAGE,
    STEP,
    TICK,
    Backoff,
    Interrupted,
    nap,
    retrying,
)
from kernel.rules.effects import retry_delay


@pytest.mark.parametrize("policy", [DEPENDENCY, MESSAGE, STEP, TICK], ids=repr)
def test_each_delay_is_between_half_its_step_and_its_step_and_the_step_doubles_to_the_cap(
    policy: Backoff,
) -> None:
    for attempt in range(1, 30):
        step = min(policy.cap_s, policy.first_s * 2 ** (attempt - 1))
        delays = [policy.delay(attempt) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays), (attempt, min(delays), max(delays))
        # Jittered: 200 draws are not all the same (instances that lost Redis together must
        # not come back to it in step).
        assert max(delays) - min(delays) > step / 10


def test_a_policy_needs_a_positive_first_step_no_larger_than_its_cap() -> None:
    with pytest.raises(ValueError, match="first_s <= cap_s"):
        Backoff(first_s=0, cap_s=1)
    with pytest.raises(ValueError, match="first_s <= cap_s"):
        Backoff(first_s=2, cap_s=1)


async def test_retrying_retries_the_named_errors_by_the_policy_and_raises_others() -> None:
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise ConnectionError("not yet")
        return "answered"

    began = time.monotonic()
    async for attempt in retrying(Backoff(0.01, 0.02), ConnectionError):
        with attempt:
            result = await flaky()
    assert (result, attempts) == ("answered", 4)
    assert time.monotonic() - began >= 0.005 + 0.01 + 0.01  # three waits, each at least half

    with pytest.raises(KeyError):
        async for attempt in retrying(Backoff(0.01, 0.02), ConnectionError):
            with attempt:
                raise KeyError("not retried")


async def test_a_sleep_ends_with_interrupted_when_its_event_is_set_and_early_when_woken() -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stopping.set)
    began = time.monotonic()
    with pytest.raises(Interrupted):
        await nap(30, until=stopping)
    assert time.monotonic() - began < 5

    back = asyncio.Event()

    async def wake() -> None:
        await back.wait()

    asyncio.get_running_loop().call_later(0.05, back.set)
    began = time.monotonic()
    await nap(30, until=asyncio.Event(), wake=wake)  # returns: the dependency is back
    assert time.monotonic() - began < 5


async def test_a_sleep_waits_by_asyncio_as_imported_whatever_a_test_patched_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test sharing the loop with an in-process fleet may patch asyncio module-wide (the
    Agents SDK's suite does): the services' loops that wait in ``nap`` must not wait through
    its fakes, nor show up in what the fakes record."""
    met: list[str] = []

    def fake(name: str) -> object:
        async def refuse(*args: object, **kwargs: object) -> None:
            met.append(name)
            raise AssertionError(f"asyncio.{name} should not be called")

        return refuse

    def ensure_future(*args: object, **kwargs: object) -> None:
        met.append("ensure_future")
        raise AssertionError("asyncio.ensure_future should not be called")

    for name in ("sleep", "wait", "wait_for", "gather"):
        monkeypatch.setattr(asyncio, name, fake(name))
    monkeypatch.setattr(asyncio, "ensure_future", ensure_future)

    began = time.monotonic()
    await nap(0.05)
    assert time.monotonic() - began >= 0.04
    changed = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, changed.set)
    await nap(30, wake=changed.wait)  # returns once woken
    with pytest.raises(Interrupted):
        await nap(30, until=changed)
    assert time.monotonic() - began < 5
    assert met == []


async def test_retrying_stops_with_interrupted_once_the_service_is_stopping() -> None:
    stopping = asyncio.Event()
    stopping.set()
    tries = 0
    with pytest.raises(Interrupted):
        async for attempt in retrying(Backoff(10, 10), ConnectionError, until=stopping):
            with attempt:
                tries += 1
                raise ConnectionError("away")
    assert tries == 1


def test_every_schedule_is_the_one_policy_exact_steps_and_jitter_handed_in() -> None:
    """The fleet's retry of a call (``retry_delay``) and the reconciler's probe steps are
    this policy's; so are the services' waits (``MESSAGE`` and the rest)."""
    probes = Backoff(0.5, 10.0)
    assert [probes.step(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert probes.step(10_000) == 10.0  # no overflow however long it keeps failing
    retry = Backoff(0.2, 10.0)
    assert retry.delay(3, jitter=0.0) == 0.4  # half the step fixed
    assert retry.delay(3, jitter=0.5) == pytest.approx(0.6)  # and a part of the other half
    assert all(
        retry_delay(n, None, base_s=0.2, cap_s=10.0, jitter=j) == retry.delay(n, jitter=j)
        for n in range(1, 12)
        for j in (0.0, 0.3, 0.999)
    )
    assert Backoff.capped(20.0, 10.0) == Backoff(10.0, 10.0)
