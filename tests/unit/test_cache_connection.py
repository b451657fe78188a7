"""Redis URL parsing and client construction (nothing is sent: no server needed)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.cache.connection import RedisTarget, connect, parse_url


def test_single_server_urls_pass_through() -> None:
    assert parse_url("redis://localhost:6379/2") == RedisTarget("single", "redis://localhost:6379/2")
    assert parse_url("rediss://:pw@cache.example:6380/0").tls


def test_sentinel_url_with_hosts_service_db_and_auth() -> None:
    target = parse_url("redis+sentinel://user:p%40ss@s1:26379,s2:26380,s3/mymaster/3?sentinel_password=sp")
    assert target.kind == "sentinel"
    assert target.hosts == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (target.service, target.db, target.username, target.password) == ("mymaster", 3, "user", "p@ss")
    assert target.sentinel_password == "sp"
    assert parse_url("redis+sentinel://[::1]:26379/svc").hosts == (("::1", 26379),)


def test_cluster_url() -> None:
    target = parse_url("redis+cluster://:secret@10.0.0.5:7000")
    assert (target.kind, target.hosts, target.password, target.username) == ("cluster", (("10.0.0.5", 7000),), "secret", None)
    assert parse_url("rediss+cluster://node").tls


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://localhost", "scheme"),
        ("localhost:6379", "scheme"),
        ("redis+sentinel://s1:26379", "service_name"),
        ("redis+sentinel://s1:26379/svc/x", "service_name"),
        ("redis+sentinel://s1:port/svc", "bad host:port"),
        ("redis+sentinel:///svc", "no host"),
        ("redis+cluster://n1:7000/1", "no db in cluster mode"),
    ],
)
def test_bad_urls_name_the_url_and_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        parse_url(url)
    assert url in str(info.value)


async def test_connect_builds_the_right_client() -> None:
    single = connect("redis://127.0.0.1:1/0", connect_timeout_s=0.1)
    assert isinstance(single, Redis)
    kwargs = single.connection_pool.connection_kwargs
    assert kwargs["socket_connect_timeout"] == 0.1
    assert kwargs["health_check_interval"] == 30
    sentinel = connect("redis+sentinel://127.0.0.1:1/svc/2")
    assert isinstance(sentinel, Redis) and sentinel.connection_pool.service_name == "svc"  # type: ignore[attr-defined]
    assert isinstance(connect("redis+cluster://127.0.0.1:1"), RedisCluster)
    await single.aclose()
    await sentinel.aclose()
