"""What tests of the gateway, and of code that uses it, need:

    builders   tier(), gateway_config(): a config around given backend URLs, where TEST_API_KEY is TEST_TENANT's;
               TableScorer: a difficulty scorer that reads a table; TableQualityPredictor: per-model quality
    contexts   request_context(), parsed_context(): a RequestContext as the edge makes it, to call a stage on;
               routed(): a context through the route's steps; run_finishers(): what the stages left to run after
               the answer
    upstream   scripted_upstream(): a fake upstream that streams exactly the bytes given (content(), CHAT_STREAM)
    servers    serve_emulator(), create_app(), running(): an emulator and a gateway in process, on free ports

A gateway in front of an emulator, in a test of your own (pytest-asyncio)::

    from openai import AsyncOpenAI
    from gateway.testing import TEST_API_KEY, create_app, gateway_config, get_profile, running, serve_emulator, tier

    async def test_my_client() -> None:
        async with serve_emulator(get_profile("instant")) as emulator:
            config = gateway_config([tier("small", [f"{emulator.url}/v1"])])
            async with running(create_app(config)) as gateway:
                client = AsyncOpenAI(base_url=f"{gateway}/v1", api_key=TEST_API_KEY)
                answer = await client.chat.completions.create(
                    model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
                assert answer.choices[0].message.content

A stage called directly, no server::

    ctx = await parsed_context(config, {"model": "small", "messages": [{"role": "user", "content": "hi"}]})
    await PolicyStage()(ctx)
    assert ctx.tenant.name == TEST_TENANT and ctx.max_tokens == 64
"""

from gateway.testing.builders import (
    TEST_API_KEY, TEST_BALANCING, TEST_TENANT, TableQualityPredictor, TableScorer, gateway_config, routes_yaml, tier,
)
from gateway.testing.contexts import parsed_context, request_context, routed, run_finishers
from gateway.testing.servers import (
    FaultConfig, RunningEmulator, create_app, get_profile, running, serve_emulator, wait_ready,
)
from gateway.testing.upstream import CHAT_STREAM, DONE, SEEN, USAGE_EVENT, chunk, content, scripted_upstream, sse_event

__all__ = [
    "CHAT_STREAM", "DONE", "SEEN", "TEST_API_KEY", "TEST_BALANCING", "TEST_TENANT", "USAGE_EVENT", "FaultConfig",
    "RunningEmulator", "TableQualityPredictor", "TableScorer", "chunk", "content", "create_app", "gateway_config",
    "get_profile", "parsed_context", "request_context", "routed", "routes_yaml", "run_finishers", "running", "scripted_upstream",
    "serve_emulator", "sse_event", "tier", "wait_ready",
]
