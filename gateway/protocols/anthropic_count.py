"""POST /v1/messages/count_tokens (Anthropic): {"input_tokens": N} for a Messages body (max_tokens not needed),
counted with the tokenizer and chat template of the tier the model names (`auto`: the tenant's default tier),
the counter the gateway prices streams without usage with. Errors as for /v1/messages, in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.errors import InvalidRequest
from gateway.protocols.anthropic import AnthropicWire
from gateway.stages.parse import decode_body
from gateway.routing.tiers import served_tier
from gateway.types import AUTO_MODEL


def count_input_tokens(config: GatewayConfig, tenant: TenantPolicy, raw: bytes,
                       count: Callable[[Tier, dict[str, Any]], int]) -> bytes:
    """POST /v1/messages/count_tokens for `tenant` (the edge resolved its key and admitted it): the body checked
    as a message (400 naming the field), the model's tier (404 unknown, 403 not allowed), then `count` with that
    tier's tokenizer."""
    body = decode_body(raw)
    chat = AnthropicWire().to_chat({**body, "max_tokens": 1, "stream": False})  # what count_tokens has no use for
    model = chat.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    tier = served_tier(config, tenant, tenant.default_tier if model == AUTO_MODEL else model, model)
    if tier.endpoint != "chat":
        raise InvalidRequest(f"the model {model!r} is an embedding model: it counts no message tokens", param="model")
    return orjson.dumps({"input_tokens": count(tier, chat)})
