"""The floor for proxy overhead: a bare aiohttp passthrough (POST body in, upstream bytes out).

    python bench/bare_proxy.py --port P --upstream http://127.0.0.1:Q [--client h1]

`--client aiohttp` (the default) is the issue's anchor: aiohttp's server and client on uvloop.
`--client h1` forwards with the gateway's own upstream client (gateway/backends/h1.py) instead: the
floor of the stack the gateway now runs on, for comparison.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web

from gateway.backends.h1 import UpstreamClient, header_lines

SKIP = frozenset({"transfer-encoding", "connection", "keep-alive"})  # hop-by-hop; Content-Length passes


def create_app(upstream: str) -> web.Application:
    app = web.Application()

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as s:
            app["session"] = s
            yield

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with app["session"].post(upstream + request.path_qs, data=body, headers=headers) as up:
            kept = {k: v for k, v in up.headers.items() if k.lower() not in SKIP}
            resp = web.StreamResponse(status=up.status, headers=kept)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/{tail:.*}", forward)
    return app


def create_h1_app(upstream: str) -> web.Application:
    app = web.Application()
    client = UpstreamClient()
    json_headers = header_lines({"Content-Type": "application/json"})

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        up = await client.post(upstream, request.path_qs, body, json_headers, connect_s=10, read_s=60)
        try:
            kept = {k: v for k, v in up.headers.items() if k not in SKIP}
            resp = web.StreamResponse(status=up.status, headers=kept)
            await resp.prepare(request)
            while chunk := await up.readany():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        finally:
            up.release()

    async def close_client(app: web.Application) -> None:
        await client.close()

    app.on_cleanup.append(close_client)
    app.router.add_post("/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9101")
    parser.add_argument("--client", choices=("aiohttp", "h1"), default="aiohttp", help="the upstream client")
    args = parser.parse_args()
    app = (create_h1_app if args.client == "h1" else create_app)(args.upstream.rstrip("/"))
    web.run_app(app, host=args.host, port=args.port, access_log=None, handler_cancellation=True, print=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
