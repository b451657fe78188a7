"""Issue 37: tenants apart by construction, through the real gateway and Redis. What one tenant embedded is not
another's cache hit, nor does another tenant's prompt follow its prefix to its replica, unless both policies
share the cache (`cache.shared`)."""

import asyncio
import hashlib
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, Tier
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_embeddings_remote import REPLICA_KEY, fake_embedder, remote_tier, sent, stored
from tests.integration.test_prefix_affinity import SYSTEM
from tests.integration.test_stream_endings import request_lines

BOB_KEY = "sk-bob"


def two_tenants(tiers: list[Tier], shared: bool = False) -> GatewayConfig:
    """alice (TEST_API_KEY) and bob (BOB_KEY), sharing the cache by policy when `shared`."""
    def tenant(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "api_key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                "cache": {"shared": shared}}

    return gateway_config(tiers, policy={"tenants": [tenant("alice", TEST_API_KEY), tenant("bob", BOB_KEY)]})


@pytest.mark.parametrize("shared", [False, True])
async def test_another_tenants_embedding_is_a_miss_unless_the_policy_shares_it(
        start_app: StartApp, redis_url: str, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    monkeypatch.setenv("FAKE_EMBED_KEY", REPLICA_KEY)
    fake = fake_embedder()
    emb = remote_tier("emb", await start_app(fake), ["ok"])
    url = await start_app(create_app(two_tenants([tier("chat", ["http://127.0.0.1:9/v1"]), emb], shared),
                                     redis_url=redis_url))
    alice, bob = (AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) for key in (TEST_API_KEY, BOB_KEY))
    with capture_logs() as logs:
        await alice.embeddings.create(model="emb", input=["a secret plan", "the launch date"])
        await stored(redis_url, 2)
        again = await alice.embeddings.create(model="emb", input=["a secret plan"])  # the control: her own hit
        probe = await bob.embeddings.create(model="emb", input=["a secret plan"])
    lines = await request_lines(logs, 3)
    assert [(line["tenant"], line["cache"]) for line in lines[:2]] == [("alice", "miss"), ("alice", "hit")]
    assert again.usage.prompt_tokens == 0
    if shared:  # both policies share the cache: one scope
        assert (lines[2]["cache"], lines[2]["cost_usd"], probe.usage.prompt_tokens) == ("hit", 0.0, 0)
        assert sent(fake)["a secret plan"] == 1
    else:  # bob's identical input is his own miss: sent upstream and priced
        assert lines[2]["tenant"] == "bob" and lines[2]["cache"] == "miss" and lines[2]["cost_usd"] > 0
        assert probe.usage.prompt_tokens == 3 and sent(fake)["a secret plan"] == 2


async def turn(session: aiohttp.ClientSession, url: str, key: str) -> str:
    body = {"model": "t", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
            "max_tokens": 3}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status == 200, await response.text()
        await asyncio.sleep(0.05)  # the prefix record is written after the answer
        return response.headers["x-gateway-backend"]


@pytest.mark.parametrize("shared", [False, True])
async def test_another_tenants_prefix_is_not_followed_unless_the_policy_shares_it(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str, shared: bool) -> None:
    replicas = [f"{(await start_emulator(seed=i)).url}/v1" for i in range(3)]
    url = await start_app(create_app(two_tenants([tier("t", replicas)], shared), redis_url=redis_url))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            await turn(session, url, TEST_API_KEY)
            await turn(session, url, TEST_API_KEY)  # the control: alice follows her own prefix
            await turn(session, url, BOB_KEY)
    first, second, probe = await request_lines(logs, 3)
    assert first["prefix_blocks"] == 0 and second["prefix_blocks"] > 0
    assert probe["tenant"] == "bob"
    assert probe["prefix_blocks"] == (second["prefix_blocks"] if shared else 0)


async def test_the_redis_keys_of_two_tenants_are_apart(start_app: StartApp, redis_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key the requests above leave in Redis is built from one tenant's scope: the two tenants' sets of
    embedding keys do not meet."""
    monkeypatch.setenv("FAKE_EMBED_KEY", REPLICA_KEY)
    emb = remote_tier("emb", await start_app(fake_embedder()), ["ok"])
    url = await start_app(create_app(two_tenants([tier("chat", ["http://127.0.0.1:9/v1"]), emb]),
                                     redis_url=redis_url))
    from redis.asyncio import Redis

    client = Redis.from_url(redis_url)
    seen: list[set[bytes]] = []
    for key in (TEST_API_KEY, BOB_KEY):
        before = set(await client.keys("emb:*"))
        await AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).embeddings.create(
            model="emb", input=["same words"])
        await stored(redis_url, len(before) + 1)
        seen.append(set(await client.keys("emb:*")) - before)
    await client.aclose()
    assert all(len(keys) == 1 for keys in seen) and not seen[0] & seen[1]




METRICS_TOKEN, ADMIN_KEY, ENV_TOKEN = "sk-metrics", "sk-admin", "sk-env-metrics"


async def test_metrics_name_tenants_only_for_a_metrics_key(start_emulator: StartEmulator, start_app: StartApp,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_METRICS_TOKEN", ENV_TOKEN)
    config = two_tenants([tier("t", [f"{(await start_emulator()).url}/v1"])])
    policy = config.policy.model_copy(update={
        "metrics_keys_sha256": (hashlib.sha256(METRICS_TOKEN.encode()).hexdigest(),),
        "admin_api_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()})
    url = await start_app(create_app(GatewayConfig.build(config.routes, policy)))
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        for key in (TEST_API_KEY, BOB_KEY):
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {key}"}) as response:
                assert response.status == 200

        async def scrape(token: str | None) -> tuple[str, str | None]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.get(f"{url}/metrics", headers=headers) as response:
                assert response.status == 200
                return await response.text(), response.headers.get("x-gateway-metrics")

        for token in (None, TEST_API_KEY, "wrong", "é"):  # nobody, a tenant, a guess: no tenant named
            text, marker = await scrape(token)
            assert marker == "tenant-series-omitted" and 'tenant="' not in text
            assert "gateway_requests_total" in text and "gateway_tenant_cost_usd_total{" not in text
        for token in (METRICS_TOKEN, ADMIN_KEY, ENV_TOKEN):
            text, marker = await scrape(token)
            assert marker is None and 'gateway_tenant_cost_usd_total{tenant="alice"}' in text
            assert 'tenant="bob"' in text
