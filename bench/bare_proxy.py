"""The floor for proxy overhead: a bare aiohttp passthrough (POST body in, upstream bytes out).

    python bench/bare_proxy.py --port P --upstream http://127.0.0.1:Q
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9101")
    args = parser.parse_args()
    app = create_app(args.upstream.rstrip("/"))
    web.run_app(app, host=args.host, port=args.port, access_log=None, handler_cancellation=True, print=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
