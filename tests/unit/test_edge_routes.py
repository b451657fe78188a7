"""Every route writes its request line (issue 37): the request path's itself, every other one through `accounted`;
the app refuses to start with a route registered otherwise (no middleware: issue 37's CPU per request)."""

from __future__ import annotations

from aiohttp import web

from gateway.app import create_app
from gateway.edge.accounted import accounted, probe, self_accounted, unaccounted
from gateway.testing import gateway_config, tier


async def handler(request: web.Request) -> web.Response:
    return web.Response()


def test_the_gateways_routes_are_all_accounted_for() -> None:
    app = create_app(gateway_config([tier("t", ["http://127.0.0.1:9/v1"])]))
    assert unaccounted(app) == []
    paths = {route.resource.canonical for route in app.router.routes() if route.resource is not None}
    assert {"/v1/chat/completions", "/dashboard/static/{name}", "/{tail}", "/healthz"} <= paths
    assert not app.middlewares  # no coroutine around the request path's own handlers


def test_a_route_registered_without_its_line_is_named() -> None:
    app = web.Application()
    app.router.add_get("/accounted", accounted(handler))
    app.router.add_get("/probe", probe(handler))
    app.router.add_post("/own", self_accounted(handler))
    assert unaccounted(app) == []
    async def raw(request: web.Request) -> web.Response:
        return await handler(request)

    app.router.add_post("/raw", raw)
    assert unaccounted(app) == ["POST /raw"]
