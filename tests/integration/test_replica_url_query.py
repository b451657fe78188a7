"""A replica URL with a query string (Azure OpenAI-style `?api-version=`): the health probe and the
continuation's template call keep it after their path, as the upstream client does for requests."""

from __future__ import annotations

from aiohttp import web

from gateway.backends.pool import ReplicaPool
from gateway.backends.h1 import UpstreamClient
from gateway.backends.probe import Prober
from gateway.backends.urls import with_path, without_suffix
from gateway.testing.builders import gateway_config, tier


def test_a_path_goes_before_the_query_string() -> None:
    url = "https://x.example/openai/deployments/d?api-version=2024-10-21"
    assert with_path(url, "/models") == "https://x.example/openai/deployments/d/models?api-version=2024-10-21"
    assert with_path("http://h:1/v1/", "/models") == "http://h:1/v1/models"
    assert without_suffix("http://h:1/v1?k=v", "/v1") == "http://h:1?k=v"
    assert without_suffix("http://h:1/v1/", "/v1") == "http://h:1"


async def test_the_health_probe_asks_models_with_the_replica_query() -> None:
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        status = 200 if request.query.get("api-version") == "2024-10-21" else 404
        return web.json_response({"data": []}, status=status)

    app = web.Application()
    app.router.add_get("/openai/deployments/d/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        config = gateway_config([tier("small", [f"http://127.0.0.1:{port}/openai/deployments/d?api-version=2024-10-21"])])
        pool = ReplicaPool()
        replica = config.routes.tiers[0].replicas[0]
        pool.state(replica, config.routes.tiers[0]).healthy = False
        client = UpstreamClient()
        try:
            await Prober(client, pool, lambda: config).check_health("small", replica)
        finally:
            await client.close()
        assert seen == ["/openai/deployments/d/models?api-version=2024-10-21"]
        assert pool.state(replica).healthy
    finally:
        await runner.cleanup()
