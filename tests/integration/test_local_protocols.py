"""Issue 19 on the real path: Responses, Anthropic Messages and embeddings through the gateway in front of the
llama.cpp tiers (Gemma 3 270M) and the in-process MiniLM tier; usage the client sees equals the log line."""

import anthropic
import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig, RoutesConfig
from gateway.testing import TEST_API_KEY, gateway_config
from tests.conftest import StartApp
from tests.integration.test_embeddings import EMBEDDER
from tests.integration.test_local_tiers import local_routes  # noqa: F401  (the module's llama.cpp servers)
from tests.integration.test_stream_endings import request_lines

PRICES = (0.05, 0.5)  # local_routes' tiers


@pytest.fixture
async def base_url(local_routes: RoutesConfig, start_app: StartApp, redis_url: str) -> str:  # noqa: F811
    routes = local_routes.model_copy(update={"tiers": (*local_routes.tiers, EMBEDDER)})
    base = gateway_config(list(routes.tiers))
    config = GatewayConfig.build(routes, PolicyConfig.model_validate(base.policy.model_dump()))
    return await start_app(create_app(config, redis_url=redis_url))


def assert_logged(line: dict[str, object], prompt: int, completion: int) -> None:
    assert (line["status"], line["outcome"], line["prompt_tokens"], line["completion_tokens"]) == (
        200, "ok", prompt, completion)
    assert line["cost_usd"] == pytest.approx((prompt * PRICES[0] + completion * PRICES[1]) / 1e6)


async def test_responses_on_llama_cpp(base_url: str) -> None:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        plain = await client.responses.create(model="small-q4", input="Name three colours.", max_output_tokens=6)
        stream = await client.responses.create(model="large-f16", input="Name three colours.", max_output_tokens=6,
                                               stream=True)
        events = [event async for event in stream]
    assert plain.output_text.strip() and plain.usage is not None and plain.usage.output_tokens == 6
    done = events[-1].response
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == done.output_text and done.output_text.strip()
    first, second = await request_lines(logs, 2)
    assert_logged(first, plain.usage.input_tokens, 6)
    assert done.usage is not None and second["usage_source"] == "backend"  # llama-server streams its usage
    assert_logged(second, done.usage.input_tokens, done.usage.output_tokens)


async def test_messages_on_llama_cpp(base_url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        message = await client.messages.create(model="small-q4", max_tokens=6, system="Answer briefly.",
                                               messages=[{"role": "user", "content": "Name three colours."}])
        async with client.messages.stream(model="small-q4", max_tokens=6, messages=[
                {"role": "user", "content": "Name three colours."}]) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert text.strip() and final.usage.output_tokens > 0
    plain, streamed = await request_lines(logs, 2)
    assert_logged(plain, message.usage.input_tokens, message.usage.output_tokens)
    assert_logged(streamed, final.usage.input_tokens, final.usage.output_tokens)


async def test_embeddings_beside_llama_cpp(base_url: str) -> None:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=TEST_API_KEY)
    answer = await client.embeddings.create(model="minilm", input=["Name three colours.", "Red, green, blue."])
    assert [len(d.embedding) for d in answer.data] == [384, 384] and answer.usage.prompt_tokens > 0
    models = [m.id async for m in client.models.list()]
    assert "minilm" in models and "small-q4" in models


async def test_a_stop_sequence_on_llama_cpp_is_named(base_url: str) -> None:
    """llama-server names the stop word only in its debug field: the gateway asks for it (issue 30)."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=TEST_API_KEY)
    ask = {"model": "small-q4", "max_tokens": 60, "messages": [{"role": "user", "content": "Name three colours."}],
           "extra_body": {"temperature": 0}}  # greedy: the same words each run (one has an "e" early)
    message = await client.messages.create(**ask, stop_sequences=["e"])  # type: ignore[arg-type]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "e")
    assert message.content[0].type == "text" and "e" not in message.content[0].text
    async with client.messages.stream(**ask, stop_sequences=["zq", "e"]) as stream:  # type: ignore[arg-type]
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "e") and "e" not in text
    capped = await client.messages.create(**{**ask, "max_tokens": 2}, stop_sequences=["zqzq"])  # type: ignore[arg-type]
    assert (capped.stop_reason, capped.stop_sequence) == ("max_tokens", None)
