"""The forms of REDIS_URL: one server, a cluster, the primary Sentinels watch."""

from __future__ import annotations

import pytest

from kernel.adapters.redis import RedisTarget, parse_redis_url
from kernel.errors import ConfigurationError


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://user:pw@cache:6380/2", "unix:///tmp/r.sock"]
)
def test_a_single_server_url_goes_to_redis_py_as_it_is(url: str) -> None:
    assert parse_redis_url(url) == RedisTarget("single", url)


def test_a_cluster_is_named_by_some_of_its_nodes() -> None:
    target = parse_redis_url("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001")
    assert target.kind == "cluster"
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert (target.username, target.password) == ("app", "s@cret")


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database() -> None:
    target = parse_redis_url("redis+sentinel://s1:26379,s2:26379/ledger/3")
    assert (target.kind, target.service, target.db) == ("sentinel", "ledger", 3)
    assert target.nodes == (("s1", 26379), ("s2", 26379))
    assert parse_redis_url("redis+sentinel://s1:26379/ledger").db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://cache:6379", "unknown scheme 'http'"),
        ("redis+cluster://cache", "every node needs host:port"),
        ("redis+cluster://cache:7000/2", "database 0 only"),
        ("redis+sentinel://s1:26379", "name the Sentinel service"),
        ("redis+sentinel://s1:26379/ledger/x", "name the Sentinel service"),
    ],
)
def test_a_malformed_url_says_what_is_wrong_and_which_forms_work(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as raised:
        parse_redis_url(url)
    assert "redis+sentinel://" in str(raised.value)  # the accepted forms are listed
