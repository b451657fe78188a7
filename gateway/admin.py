"""Admin endpoints, behind the policy's admin key: GET /admin/config, POST /admin/explain."""

from __future__ import annotations

import hashlib
import hmac

import orjson
from aiohttp import web

from gateway.edge.accounted import accounted, refuse
from gateway.state import GATEWAY, Gateway
from gateway.body import read_body
from gateway.edge.keys import bearer
from gateway.errors import AuthenticationFailed, GatewayError, InvalidRequest, NotFound
from gateway.routing.explain import explain
from gateway.stages.parse import check_depth
from gateway.types import Endpoint

JSON = "application/json"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/config", accounted(admin_config))
    app.router.add_post("/admin/explain", accounted(admin_explain))


def _check_admin(request: web.Request, gateway: Gateway) -> None:
    stored = gateway.config.policy.admin_api_key_sha256
    if stored is None:
        raise NotFound("admin endpoints are off: set admin_api_key_sha256 in the policy file")
    key = bearer(request.headers)  # 401 when its bytes are not UTF-8
    given = hashlib.sha256((key or "").encode()).hexdigest()
    if key is None or not hmac.compare_digest(given, stored):
        raise AuthenticationFailed("admin endpoints need the admin API key")


async def admin_config(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        _check_admin(request, gateway)
    except GatewayError as err:
        return refuse(request, err)
    config, reloader = gateway.config, gateway.reloader
    body = {"version": config.version, "loaded_at": config.loaded_at, "tiers": list(config.tiers),
            "tenants": sorted(t.name for t in config.tenants_by_key_hash.values()), "hot_reload": reloader is not None}
    if reloader is not None:
        state = reloader.state
        body.update({"files": [str(f) for f in state.files], "reloads": state.reloads,
                     "last_error": [str(i) for i in state.last_error] or None, "last_error_at": state.last_error_at})
    return web.Response(body=orjson.dumps(body), content_type=JSON)


async def admin_explain(request: web.Request) -> web.Response:
    """Body: {"tenant": NAME, "request": {an OpenAI chat body}, "endpoint": "chat"|"completions",
    "session_id": the conversation's x-session-id (optional)}."""
    gateway = request.app[GATEWAY]
    try:
        _check_admin(request, gateway)
        raw = await read_body(request, gateway.config.policy.max_body_bytes, gateway.client_limits.body_timeout_s)
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise InvalidRequest(f"the body is not valid JSON: {err}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("tenant"), str):
            raise InvalidRequest("send {\"tenant\": NAME, \"request\": {...}}", param="tenant")
        check_depth(raw, payload)
        body = payload.get("request")
        if not isinstance(body, dict):
            raise InvalidRequest("'request' must be an OpenAI request body", param="request")
        endpoint: Endpoint = "completions" if payload.get("endpoint") == "completions" else "chat"
        session_id = payload.get("session_id")  # the conversation's x-session-id, to see what its session holds
        steps = gateway.path.routing_steps() if gateway.path is not None else None  # the serving steps, dry
        report = await explain(gateway.config, payload["tenant"], body, endpoint=endpoint, scorer=gateway.scorer,
                               pool=gateway.pool, responses=gateway.responses, steps=steps,
                               session_header=session_id if isinstance(session_id, str) else None,
                               predictor=gateway.predictor, live=True)
    except GatewayError as err:
        return refuse(request, err)
    return web.Response(body=orjson.dumps(report), content_type=JSON)
