"""The overview's numbers (kernel/rules/overview.py): buckets, latency histograms and their
percentiles, the increments a batch makes, and the series a chart draws."""

from __future__ import annotations

import pytest

from kernel.rules.overview import (
    HOUR,
    LATENCY_BUCKETS,
    MINUTE,
    LatencyJoin,
    OutcomeFacts,
    TurnFacts,
    bucket_start,
    bucket_upper_s,
    fold,
    latency_bucket,
    percentile,
    series,
)

T0 = 1_800_000_000.0  # a minute's start (and an hour's)


def test_a_time_falls_in_the_bucket_that_starts_at_or_before_it() -> None:
    assert bucket_start(T0 + 59.9, MINUTE) == T0
    assert bucket_start(T0 + 60, MINUTE) == T0 + 60
    assert bucket_start(T0 + 61, HOUR) == bucket_start(T0, HOUR)


@pytest.mark.parametrize("seconds", [0.0005, 0.004, 0.25, 1.7, 42.0, 3600.0])
def test_a_latency_is_at_most_its_buckets_upper_bound_and_above_the_one_before(
    seconds: float,
) -> None:
    index = latency_bucket(seconds)
    assert seconds <= bucket_upper_s(index) * (1 + 1e-9)
    if index > 0:
        assert seconds > bucket_upper_s(index - 1)
    assert bucket_upper_s(index) / max(seconds, 0.001) < 1.2  # within a bucket's width


def test_latencies_beyond_the_last_bucket_land_in_it() -> None:
    assert latency_bucket(10**9) == LATENCY_BUCKETS - 1


def test_percentiles_of_a_histogram_are_bucket_bounds_and_none_when_empty() -> None:
    histogram = {latency_bucket(0.010): 98, latency_bucket(2.0): 2}
    assert percentile(histogram, 0.5) == bucket_upper_s(latency_bucket(0.010))
    assert percentile(histogram, 0.99) == bucket_upper_s(latency_bucket(2.0))
    assert percentile({}, 0.5) is None


def test_a_batch_adds_to_each_bucket_it_touches_in_every_width() -> None:
    outcomes = [
        OutcomeFacts(T0 + 1, "acme", "charge", "succeeded", "applied"),
        OutcomeFacts(T0 + 2, "acme", "charge", "timed_out", "unknown"),
        OutcomeFacts(T0 + 61, "globex", "search", "succeeded", "applied"),
    ]
    turns = [TurnFacts(T0 + 3, "completed", 0.2), TurnFacts(T0 + 62, "failed", None)]
    minute, hour = fold(outcomes, turns, (MINUTE, HOUR))
    assert minute.increments[int(T0)] == {
        "calls|succeeded|applied": 1, "calls|timed_out|unknown": 1, "tenant|acme": 2,
        "tool|charge": 2, "turns|completed": 1, f"lat|{latency_bucket(0.2)}": 1,
    }  # fmt: skip
    assert minute.increments[int(T0) + 60]["turns|failed"] == 1
    assert sum(hour.increments[bucket_start(T0, HOUR)].values()) == 12  # 3 x 3 + 2 + 1


def test_the_series_has_a_point_per_bucket_rates_per_second_and_gauges_where_sampled() -> None:
    starts = [int(T0), int(T0) + 60, int(T0) + 120]
    stored = {
        starts[0]: {"calls|succeeded|applied": "120", "turns|completed": "30",
                    f"lat|{latency_bucket(0.1)}": "30", "tenant|acme": "120",
                    "g|pool.lag|default": "4"},
        starts[2]: {"calls|failed|unknown": "6", "tenant|globex": "6"},
    }  # fmt: skip
    drawn = series(stored, starts, MINUTE)
    assert drawn.calls["status:succeeded"] == [2.0, 0.0, 0.0]
    assert drawn.calls["effect:unknown"] == [0.0, 0.0, 0.1]
    assert drawn.turns_per_s == [0.5, 0.0, 0.0]
    assert drawn.latency_p50_s == [bucket_upper_s(latency_bucket(0.1)), None, None]
    assert drawn.gauges["pool.lag|default"] == [4.0, None, None]
    assert drawn.tenants == {"acme": 120, "globex": 6}


def test_a_latency_added_after_its_turn_was_counted_does_not_count_the_turn_again() -> None:
    [minute] = fold([], [TurnFacts(T0 + 5, "completed", 0.3, counted=True)], (MINUTE,))
    assert minute.increments[int(T0)] == {f"lat|{latency_bucket(0.3)}": 1}


def test_a_turn_gets_its_latency_whichever_of_its_two_records_is_read_first() -> None:
    join = LatencyJoin(capacity=10)
    assert join.asked(("a", "r1", 0), 1.0) is None
    assert join.ended(("a", "r1", 0), 1.25, "completed") == TurnFacts(1.25, "completed", 0.25)
    # A backlog: the result's partition ran ahead of the response's.
    assert join.ended(("a", "r2", 0), 2.4, "failed") == TurnFacts(2.4, "failed", None)
    late = join.asked(("a", "r2", 0), 2.0)
    assert late is not None and late.counted and late.latency_s == pytest.approx(0.4)


def test_the_join_forgets_its_oldest_waiting_turns_beyond_its_capacity() -> None:
    join = LatencyJoin(capacity=2)
    for n in range(3):
        join.asked(("a", f"r{n}", 0), float(n))
    assert join.ended(("a", "r0", 0), 5.0, "completed").latency_s is None  # forgotten
    assert join.ended(("a", "r2", 0), 5.0, "completed").latency_s == 3.0
