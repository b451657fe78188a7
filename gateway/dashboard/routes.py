"""GET /dashboard (the page), /dashboard/data.json (what it draws) and /dashboard/static/ (uPlot, the
page's script). The page and its data need the policy's admin key or one of its dashboard viewer keys:
as a bearer token, or once as `?key=` (the gateway then sets an HttpOnly cookie and drops the key
from the address)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import orjson
from aiohttp import web

from gateway.state import GATEWAY, Gateway
from gateway.dashboard.replicas import replica_rows
from gateway.dashboard.snapshot import snapshot
from gateway.errors import AuthenticationFailed, error_body

STATIC = Path(__file__).parent / "static"
COOKIE = "gateway_dashboard"
LOGIN = b"""<!doctype html><meta charset="utf-8"><title>gateway dashboard</title>
<form method="get" action="/dashboard" style="font:16px sans-serif;margin:4em">
<p>The dashboard needs the admin key or a dashboard viewer key.</p>
<input type="password" name="key" autofocus> <button>Open</button></form>"""


def add_routes(app: web.Application) -> None:
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/data.json", data)
    app.router.add_static("/dashboard/static", STATIC)


def _allowed(request: web.Request, gateway: Gateway, key: str | None = None) -> bool:
    """Whether the request carries the admin key or a viewer key (bearer, cookie, or `key`)."""
    if key is None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE, "")
    if not key:
        return False
    policy = gateway.config.policy
    given = hashlib.sha256(key.encode()).hexdigest()
    stored = [*policy.dashboard_viewer_keys_sha256, *filter(None, [policy.admin_api_key_sha256])]
    return any(hmac.compare_digest(given, digest) for digest in stored)


async def page(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    key = request.query.get("key")
    if key is not None:
        if not _allowed(request, gateway, key):
            return web.Response(body=LOGIN, status=401, content_type="text/html")
        response = web.HTTPSeeOther("/dashboard")
        response.set_cookie(COOKIE, key, path="/dashboard", httponly=True, samesite="Strict")
        raise response
    if not _allowed(request, gateway):
        return web.Response(body=LOGIN, status=401, content_type="text/html")
    return web.FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-store"})


async def data(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if not _allowed(request, gateway):
        err = AuthenticationFailed("the dashboard needs the admin key or a dashboard viewer key")
        return web.Response(body=error_body(err), status=err.status, content_type="application/json")
    gates = gateway.path.admission.gates if gateway.path is not None else {}
    redis = "off" if gateway.redis is None else "up" if gateway.redis.up else "down"
    body = snapshot(gateway.metrics.live, gateway.config, gates, redis)
    body["replicas"] = replica_rows(gateway.pool, gateway.config)
    return web.Response(body=orjson.dumps(body), content_type="application/json",
                        headers={"Cache-Control": "no-store"})
