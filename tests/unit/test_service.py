"""How every service process tunes its garbage collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kernel.settings import Settings
from toolfleet.app.service import tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_what_exists_and_collects_less_often() -> None:
    long_lived = [object() for _ in range(10)]
    tune_gc(Settings().gc_thresholds)
    assert gc.get_freeze_count() >= len(long_lived)
    assert gc.get_threshold() == (100_000, 20, 40)


def test_the_thresholds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_GC_THRESHOLDS", "[5000, 10, 10]")
    assert Settings().gc_thresholds == (5000, 10, 10)
