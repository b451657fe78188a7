"""The OpenAPI 3.1 description of the gateway's endpoints, served at GET /openapi.json.

Built from the serving config (the model names) and from the parse stage's own constants, so it
says what the gateway accepts: fields it does not use pass through (`additionalProperties`), and
every error is the OpenAI error object. Schemathesis fuzzes the live gateway against it in CI.
"""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.experiments.feedback import MAX_COMMENT, REQUEST_ID, THUMBS
from gateway.stages.parse import MAX_MESSAGES, MAX_TOKENS_CEILING, NUMBER_RANGES, ROLES
from gateway.types import AUTO_MODEL

Schema = dict[str, Any]

ERROR: Schema = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
ANTHROPIC_ERROR: Schema = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
}
STOP: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                          {"type": "null"}]}
MESSAGE: Schema = {"anyOf": [
    {"type": "object", "required": ["role", "content"],
     "properties": {"role": {"enum": sorted(ROLES)}, "content": {"type": ["string", "array"]}}},
    {"type": "object", "required": ["role"],
     "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "array", "null"]}}},
]}
PROMPT: Schema = {"anyOf": [
    {"type": "string"},
    {"type": "array", "minItems": 1, "items": {"type": "string"}},
    {"type": "array", "minItems": 1, "items": {"type": "integer"}},
    {"type": "array", "minItems": 1, "items": {"type": "array", "items": {"type": "integer"}}},
]}
SSE_EVENT: Schema = {  # one event: a chunk, `[DONE]`, or an error object when a started stream fails
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
ERROR_STATUSES = {
    "400": "invalid request: the message names the field, `param` holds it",
    "401": "missing or unknown API key", "403": "the tenant may not use this tier",
    "404": "unknown model", "408": "the body did not arrive in time", "413": "body or prompt too large",
    "429": "rate limit or daily budget (Retry-After)", "502": "every replica failed before the first byte",
    "503": "overloaded, or the replicas answered 429 (Retry-After)", "504": "the replicas did not answer in time",
}


def openapi_spec(config: GatewayConfig) -> Schema:
    """The OpenAPI document for a gateway serving `config`."""
    models = [AUTO_MODEL, *(name for name, tier in config.tiers.items() if tier.endpoint == "chat")]
    embedders = {name: tier.dimensions or 0 for name, tier in config.tiers.items() if tier.endpoint == "embeddings"}
    bearer: list[Schema] = [{"apiKey": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "gateway", "version": config.version,
                 "description": "OpenAI-compatible routing gateway: chat and text completions, OpenAI Responses, "
                                "Anthropic Messages (streaming or not) and embeddings."},
        "paths": {
            "/v1/chat/completions": {"post": _completion("chat", models, bearer)},
            "/v1/completions": {"post": _completion("completions", models, bearer)},
            **_translated(models, embedders, bearer),
            "/v1/feedback": {"post": _feedback(bearer)},
            "/v1/models": {"get": _get("the models: auto and each tier (embedding tiers too)",
                                       _json({"type": "object"}))},
            "/healthz": {"get": _get("liveness", _json({"type": "object"}))},
            "/readyz": {"get": {**_get("readiness", _json({"type": "object"})),
                                "responses": {"200": _json({"type": "object"}, "ready"),
                                              "503": _json({"type": "object"}, "starting or draining")}}},
            "/metrics": {"get": _get("Prometheus metrics", {"description": "OK", "content": {
                "text/plain": {"schema": {"type": "string"}}}})},
            "/openapi.json": {"get": _get("this document", _json({"type": "object"}))},
            "/admin/config": {"get": {**_get("serving config version, last reload error", _json({"type": "object"})),
                                      "security": [{"adminKey": []}], "responses": _admin_responses()}},
            "/admin/explain": {"post": {
                "summary": "a routing decision explained", "security": [{"adminKey": []}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["tenant", "request"],
                    "properties": {"tenant": {"type": "string"}, "request": {"type": "object"},
                                   "endpoint": {"enum": ["chat", "completions"]}}}}}},
                "responses": {**_admin_responses(), "400": _error("invalid request")},
            }},
        },
        "components": {
            "schemas": {"Error": ERROR, "AnthropicError": ANTHROPIC_ERROR},
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"},
                                "anthropicKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                                "adminKey": {"type": "http", "scheme": "bearer"}},
        },
    }


def _completion(endpoint: str, models: list[str], security: list[Schema]) -> Schema:
    """POST /v1/chat/completions or /v1/completions."""
    properties: Schema = {
        "model": {"enum": models},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TOKENS_CEILING},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TOKENS_CEILING},
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 16},
        "seed": {"type": ["integer", "null"]},
        "stop": STOP,
        **{name: {"type": ["number", "null"], "minimum": low, "maximum": high}
           for name, (low, high) in NUMBER_RANGES.items()},
    }
    if endpoint == "chat":
        properties["messages"] = {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": MESSAGE}
        required = ["model", "messages"]
    else:
        properties["prompt"] = PROMPT
        required = ["model", "prompt"]
    body = {"type": "object", "required": required, "properties": properties, "additionalProperties": True,
            "dependentSchemas": {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}}
    return _post("chat completion" if endpoint == "chat" else "text completion", body, security)


def _post(summary: str, body: Schema, security: list[Schema], error: str = "Error", stream: bool = True) -> Schema:
    """A POST endpoint answering JSON (or server-sent events), its errors in the `error` schema."""
    content: Schema = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    ok = {"description": "the answer: JSON, or server-sent events when `stream` is true", "content": content}
    return {
        "summary": summary, "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": ok, **{status: _error(why, error) for status, why in ERROR_STATUSES.items()}},
    }


def _translated(models: list[str], embedders: dict[str, int], bearer: list[Schema]) -> Schema:
    """The paths of the other protocols: OpenAI Responses, Anthropic Messages, embeddings."""
    sampling = {name: {"type": ["number", "null"], "minimum": low, "maximum": high}
                for name, (low, high) in NUMBER_RANGES.items() if name in ("temperature", "top_p")}
    tokens = {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_CEILING}
    texts: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
    responses = {"type": "object", "required": ["model", "input"], "additionalProperties": True, "properties": {
        "model": {"enum": models}, "input": texts, "instructions": {"type": ["string", "null"]},
        "max_output_tokens": {**tokens, "type": ["integer", "null"]}, "stream": {"type": ["boolean", "null"]},
        "metadata": {"type": ["object", "null"]}, "user": {"type": ["string", "null"]}, **sampling,
        "previous_response_id": {"type": "null"}, "store": {"enum": [False, None]}}}
    messages = {"type": "object", "required": ["model", "max_tokens", "messages"], "additionalProperties": True,
                "properties": {"model": {"enum": models}, "max_tokens": tokens, "system": texts,
                               "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                               "stop_sequences": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                               "stream": {"type": "boolean"}, **sampling}}
    inputs = {"anyOf": [{"type": "string", "minLength": 1},
                        {"type": "array", "minItems": 1, "maxItems": 2048,
                         "items": {"type": "string", "minLength": 1}}]}
    embeddings = {"type": "object", "required": ["model", "input"], "additionalProperties": True, "properties": {
        "model": {"enum": [AUTO_MODEL, *embedders]}, "input": inputs, "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"enum": sorted(set(embedders.values()))}, "user": {"type": "string"}}}
    anthropic: list[Schema] = [{"anthropicKey": []}, *bearer]
    paths = {"/v1/responses": {"post": _post("OpenAI Responses (stateless), via chat completions", responses, bearer)},
             "/v1/messages": {"post": _post("Anthropic Messages, via chat completions", messages, anthropic,
                                            "AnthropicError")},
             "/v1/messages/count_tokens": {"post": _post(
                 "Anthropic token count: {\"input_tokens\": N}, by the tier's tokenizer and chat template",
                 {**messages, "required": ["model", "messages"]}, anthropic, "AnthropicError", stream=False)}}
    if embedders:
        paths["/v1/embeddings"] = {"post": _post("embeddings of an embedding tier (in process or its replicas); "
                                                 "`dimensions`: the tier's own only", embeddings, bearer, stream=False)}
    return paths


def _feedback(security: list[Schema]) -> Schema:
    """POST /v1/feedback: a score for one of the tenant's answers (gateway.experiments.feedback)."""
    body = {"type": "object", "required": ["request_id"], "additionalProperties": False, "properties": {
        "request_id": {"type": "string", "pattern": REQUEST_ID.pattern, "description": "the answer's x-request-id"},
        "score": {"type": "number", "minimum": 0, "maximum": 1}, "thumbs": {"enum": sorted(THUMBS)},
        "comment": {"type": "string", "maxLength": MAX_COMMENT}},
        "oneOf": [{"required": ["score"], "not": {"required": ["thumbs"]}},
                  {"required": ["thumbs"], "not": {"required": ["score"]}}]}
    ok = {"type": "object", "required": ["object", "request_id", "score", "created"], "properties": {
        "object": {"const": "feedback"}, "request_id": {"type": "string"}, "score": {"type": "number"},
        "created": {"type": "integer"}, "experiment": {"type": ["string", "null"]},
        "arm": {"type": ["string", "null"]}}}
    errors = {"400": "invalid body: the message names the field", "401": "missing or unknown API key",
              "404": "no such request for this API key (unknown, expired, or another tenant's)",
              "408": ERROR_STATUSES["408"], "413": ERROR_STATUSES["413"],
              "415": "unsupported Content-Encoding", "503": "the request store is unavailable (Retry-After)"}
    return {"summary": "feedback on an answer: a score in [0, 1] or thumbs up/down, stored and logged",
            "security": security,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": _json(ok, "accepted"), **{status: _error(why) for status, why in errors.items()}}}


def _admin_responses() -> Schema:
    return {"200": _json({"type": "object"}), "401": _error("not the admin key"),
            "404": _error("admin endpoints are off (no admin key in the policy)")}


def _get(summary: str, ok: Schema) -> Schema:
    return {"summary": summary, "responses": {"200": ok}}


def _json(schema: Schema, description: str = "OK") -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str, schema: str = "Error") -> Schema:
    return _json({"$ref": f"#/components/schemas/{schema}"}, description)
