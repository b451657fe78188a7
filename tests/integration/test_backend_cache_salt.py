"""Issue 37: the backend's own prefix cache, kept per tenant by vLLM's `cache_salt` (`prefix_cache_salt` on a
replica or tier). Through the real gateway and the emulator (which keys its prefix cache by the salt as vLLM
does): with salting on, bob's prompt does not reuse the prefix alice warmed (no cached tokens, a cold TTFT);
off, it does (the leak the option closes); tenants whose policies share the cache share the salt."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Tier
from gateway.keyspace import cache_salt
from gateway.testing import TEST_API_KEY, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_stream_endings import request_lines
from tests.integration.test_tenants_apart import BOB_KEY, two_tenants

PROMPT = " ".join(f"fact {i} about the harbour." for i in range(400))  # ~2,400 tokens: ~0.6 s of prefill cold


def salted_tier(url: str, salt: bool) -> Tier:
    plain = tier("t", [url], context_window=32768)
    return Tier.model_validate({**plain.model_dump(), "prefix_cache_salt": salt,
                                "replicas": [r.model_dump(exclude={"prefix_cache_salt"}) for r in plain.replicas]})


async def ask(session: aiohttp.ClientSession, url: str, key: str) -> None:
    body = {"model": "t", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "stream": True}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status == 200, await response.text()
        await response.read()


@pytest.mark.parametrize(("salt", "shared"), [(True, False), (False, False), (True, True)])
async def test_another_tenant_does_not_get_the_warm_prefix_when_salted(
        start_emulator: StartEmulator, start_app: StartApp, salt: bool, shared: bool) -> None:
    emulator = await start_emulator("fp16")
    url = await start_app(create_app(two_tenants([salted_tier(f"{emulator.url}/v1", salt)], shared)))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            for key in (TEST_API_KEY, TEST_API_KEY, BOB_KEY):  # alice cold, alice warm (the control), bob
                await ask(session, url, key)
    cold, warm, probe = await request_lines(logs, 3)
    assert probe["tenant"] == "bob" and cold["prompt_tokens"] > 2000
    assert cold["cached_tokens"] == 0 and warm["cached_tokens"] > 2000 and warm["ttft_ms"] < cold["ttft_ms"] / 3
    if salt and not shared:
        assert probe["cached_tokens"] == 0 and probe["ttft_ms"] > 3 * warm["ttft_ms"]
    else:  # no salt: the backend reuses alice's prefix for bob; shared by policy: one scope, one salt
        assert probe["cached_tokens"] == warm["cached_tokens"] and probe["ttft_ms"] < cold["ttft_ms"] / 3


def test_the_body_sent_upstream_carries_the_scope_salt_over_the_clients() -> None:
    from gateway.keyspace import tenant_scope
    from tests.unit.test_keyspace import tenant

    alice, bob, shared = tenant("alice"), tenant("bob"), tenant("alice", True)
    assert cache_salt(alice) != cache_salt(bob) and cache_salt(shared) == cache_salt(tenant("bob", True))
    assert cache_salt(None) not in (cache_salt(alice), cache_salt(shared)) and tenant_scope(alice) not in cache_salt(
        alice)
    body = _body({"model": "t", "messages": [], "cache_salt": cache_salt(bob)}, alice, salt=True)
    assert body["cache_salt"] == cache_salt(alice)  # the client cannot pick another scope's salt
    assert "cache_salt" not in _body({"model": "t", "messages": []}, alice, salt=False)


def _body(client_body: dict[str, Any], tenant: Any, salt: bool) -> dict[str, Any]:
    from gateway.context import RequestContext
    from gateway.testing import gateway_config
    from gateway.upstream.hop import UpstreamHop

    config = gateway_config([salted_tier("http://127.0.0.1:9/v1", salt)])
    ctx = RequestContext("r", "chat", config, b"", None, 0.0, 0.0, None)
    ctx.body, ctx.tenant = client_body, tenant
    return UpstreamHop._body(ctx, config.routes.tiers[0].replicas[0])
