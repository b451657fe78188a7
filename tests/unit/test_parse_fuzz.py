"""Property tests of the parse stage: whatever JSON a client nests in a body (any shape, hundreds of
levels deep, in known or unknown fields), the body is either refused with a 4xx naming a field, or
accepted and then encodes again: upstream (orjson) and into a cache key (the body wrapped 2 levels
deeper). Nothing in between raises anything else."""

import json
import time
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cache.keys import response_key
from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.stages.parse import ParseStage
from gateway.testing import gateway_config, tier

CONFIG = gateway_config([tier("small", ["http://127.0.0.1:1/v1"])])
CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
SHAPES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=20)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A chain of arrays and objects up to 300 levels, around any shape."""
    value = draw(SHAPES)
    depth = draw(st.integers(0, 300) | st.sampled_from([62, 63, 64, 253, 254, 255]))  # and around the limits
    for is_object in draw(st.lists(st.booleans(), min_size=depth, max_size=depth)):
        value = {"k": value} if is_object else [value]
    return value


@settings(max_examples=300, deadline=None, database=None)
@given(field=st.sampled_from(["x", "tools", "messages", "stop", "metadata", "response_format"]),
       value=deep(), inside_message=st.booleans())
async def test_any_nesting_is_refused_naming_a_field_or_encodes_again(field: str, value: Any,
                                                                     inside_message: bool) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "hi", field: value}]} if inside_message else {
        **CHAT, field: value}
    raw = json.dumps(body).encode()  # the stdlib writes any depth; orjson stops at 254
    ctx = RequestContext("r", "chat", CONFIG, raw, None, time.perf_counter(), time.time())
    try:
        await ParseStage()(ctx)
    except InvalidRequest as err:
        assert 400 <= err.status < 500 and err.param
        return
    assert orjson.loads(orjson.dumps(ctx.body)) == orjson.loads(raw)
    assert ctx.reading is not None
    response_key("tenant", "small", ctx.reading)
