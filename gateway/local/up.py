"""`gateway up`: local backends as children (restarted when one exits), then the gateway; Ctrl-C or SIGTERM
stops all of it."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

from gateway import server
from aiohttp import web

from gateway.config import GatewayConfig
from gateway.local.children import Child, start_children, stop_children, wait_healthy
from gateway.local.supervisor import Supervisor

EXAMPLE = """
Ready. Try it:

  curl -s http://{host}:{port}/v1/chat/completions -H 'Authorization: Bearer sk-demo' \\
       -H 'Content-Type: application/json' \\
       -d '{{"model": "auto", "messages": [{{"role": "user", "content": "Say hello"}}], "max_tokens": 32}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='http://{host}:{port}/v1', api_key='sk-demo'); \\
print(c.chat.completions.create(model='auto', messages=[{{'role': 'user', 'content': 'Say hello'}}], \\
max_tokens=32).choices[0].message.content)"

Models: {models}. Request log lines go to {log}. Ctrl-C stops everything.
Dashboard: {dashboard}
"""
DEMO_VIEWER_KEY = "sk-dashboard"  # the viewer key of policies/local.yaml and policies/emulator.yaml


def up(config: GatewayConfig, app: web.Application, host: str, port: int, log_target: str,
       backend_logs: Path, restart: bool = True) -> int:
    """Start the routes' local backends, wait until they are healthy, then serve `app` until a signal;
    a backend that exits is started again (`restart`)."""
    children = start_children(config.routes, backend_logs)
    try:
        server.run(_serve(config, app, host, port, children, log_target, backend_logs, restart))
    except RuntimeError as err:
        print(f"gateway up failed: {err}", file=sys.stderr)
        return 1
    finally:
        stop_children(children)
    return 0


def dashboard_url(config: GatewayConfig, host: str, port: int) -> str:
    """Where the dashboard is, and the key to log in with there: the demo viewer key when the policy has it
    (the key goes in the login form, never in the address)."""
    demo = hashlib.sha256(DEMO_VIEWER_KEY.encode()).hexdigest() in config.policy.dashboard_viewer_keys_sha256
    key = DEMO_VIEWER_KEY if demo else "your admin or a viewer key"
    return f"http://{host}:{port}/dashboard (log in with {key})"


async def _serve(
    config: GatewayConfig, app: web.Application, host: str, port: int, children: list[Child], log_target: str,
    backend_logs: Path, restart: bool,
) -> None:
    stop = server.stop_on_signals()  # first: a signal during start-up must still stop the children
    print(f"starting {len(children)} local backend(s); their logs: {backend_logs}/", file=sys.stderr)
    healthy = asyncio.ensure_future(wait_healthy(children))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((healthy, stopped), return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        healthy.cancel()
        return
    stopped.cancel()
    healthy.result()
    models = ", ".join(["auto", *config.tiers])
    print(EXAMPLE.format(host=host, port=port, models=models, log=log_target,
                         dashboard=dashboard_url(config, host, port)), file=sys.stderr)
    supervisor = asyncio.ensure_future(Supervisor(children).run(stop) if restart else stop.wait())
    try:
        await server.serve_until_signal(app, host, port, stop)
    finally:
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
