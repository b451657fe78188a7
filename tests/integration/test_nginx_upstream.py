"""The upstream client (gateway/backends/h1.py) through a real server: Debian's nginx (`make nginx`, a
prerequisite of `make test`) as a reverse proxy in front of the backend emulator, started by the test on
loopback ports: keep-alive limits that close connections, idle closes, `proxy_buffering off` streaming,
TLS with a CA made by the test (and a client certificate), and a 103 where nginx can send one."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from gateway.backends.h1 import ConnectFailed, UpstreamClient
from gateway.config.routes import ReplicaTls
from gateway.emulator.harness import RunningEmulator
from gateway.local.redis_server import free_ports
from tests.conftest import StartEmulator
from tests.unit.h1_certs import Pki, make_pki
from tests.unit.h1_scripted import JSON, client  # noqa: F401 (a fixture)

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
pytestmark = [pytest.mark.skipif(NGINX is None, reason="nginx is not installed: `make nginx` installs Debian's"),
              pytest.mark.both_loops]

CHAT = orjson.dumps({"model": "m", "max_tokens": 12, "messages": [{"role": "user", "content": "hello there"}]})
STREAM = orjson.dumps({"model": "m", "max_tokens": 20, "stream": True,
                       "messages": [{"role": "user", "content": "tell me a story"}]})

CONFIG = """
worker_processes 1;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
    upstream replica {{ server 127.0.0.1:{replica}; keepalive 4; }}
    keepalive_requests 3;
    keepalive_timeout 1s;
    ssl_certificate {pki.server_cert}; ssl_certificate_key {pki.server_key};
    server {{
        listen 127.0.0.1:{plain};
        listen 127.0.0.1:{tls} ssl;
        {early_hints}
        location / {{
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            add_header X-Connection $connection always;
            add_header X-Connection-Requests $connection_requests always;
        }}
    }}
    server {{
        listen 127.0.0.1:{mtls} ssl;
        ssl_verify_client on;
        ssl_client_certificate {pki.ca};
        location / {{ proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
}}
"""


def nginx_version() -> tuple[int, ...]:
    assert NGINX is not None
    printed = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr
    found = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", printed)
    return tuple(int(part) for part in found.groups()) if found else (0,)


EARLY_HINTS = nginx_version() >= (1, 29, 0) if NGINX else False  # the early_hints directive came in 1.29.0


@dataclass(frozen=True)
class Nginx:
    plain: str  # http://127.0.0.1:PORT/v1
    tls_port: int
    mtls_port: int
    pki: Pki


def start_nginx(directory: Path, replica_port: int, pki: Pki) -> tuple[subprocess.Popen[bytes], Nginx]:
    assert NGINX is not None
    plain, tls, mtls = free_ports(3)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / sub).mkdir(exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(CONFIG.format(
        dir=directory, replica=replica_port, plain=plain, tls=tls, mtls=mtls, pki=pki,
        user="user root;" if os.geteuid() == 0 else "",  # workers read the test's private temp directory
        early_hints="early_hints 1;" if EARLY_HINTS else ""))
    process = subprocess.Popen([NGINX, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(conf),
                                "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", mtls), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", plain), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"nginx did not start: {process.communicate()[1].decode()[-2000:]}") from None
            time.sleep(0.05)
    return process, Nginx(f"http://127.0.0.1:{plain}/v1", tls, mtls, pki)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("nginx-pki"))


@pytest.fixture
async def nginx(start_emulator: StartEmulator, pki: Pki, tmp_path: Path) -> AsyncIterator[Nginx]:
    emulator: RunningEmulator = await start_emulator("int8")
    process, running = start_nginx(tmp_path, int(emulator.url.rsplit(":", 1)[1]), pki)
    try:
        yield running
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tls_url(port: int, host: str = "localhost") -> str:
    return f"https://{host}:{port}/v1"


async def test_keepalive_requests_closes_every_third_connection_and_nothing_is_sent_twice(
        nginx: Nginx, client: UpstreamClient) -> None:
    seen: list[tuple[str, str]] = []
    for _ in range(7):
        response = await client.post(nginx.plain, "/chat/completions", CHAT, JSON, connect_s=2, read_s=10)
        assert response.status == 200
        answer = orjson.loads(await response.read())
        assert answer["choices"][0]["message"]["content"]
        seen.append((response.headers["x-connection"], response.headers["x-connection-requests"]))
    assert [requests for _, requests in seen] == ["1", "2", "3", "1", "2", "3", "1"]
    assert len({connection for connection, _ in seen}) == 3
    assert client.resends == 0


async def test_a_connection_nginx_closed_while_idle_is_not_reused(nginx: Nginx, client: UpstreamClient) -> None:
    first = await client.post(nginx.plain, "/chat/completions", CHAT, JSON, connect_s=2, read_s=10)
    await first.read()
    assert client.idle_count() == 1
    time.sleep(1.5)  # past keepalive_timeout 1s, the event loop held: the close is still unread when we reuse
    second = await client.post(nginx.plain, "/chat/completions", CHAT, JSON, connect_s=2, read_s=10)
    await second.read()
    assert second.headers["x-connection"] != first.headers["x-connection"]
    assert client.resends == 0


async def test_a_stream_through_proxy_buffering_off_arrives_as_it_is_generated(
        nginx: Nginx, client: UpstreamClient) -> None:
    response = await client.post(nginx.plain, "/chat/completions", STREAM, JSON, connect_s=2, read_s=10)
    assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
    arrivals, body = [], b""
    while chunk := await response.readany():
        arrivals.append(time.monotonic())
        body += chunk
    response.release()
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    contents = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]
                if orjson.loads(e).get("choices")]
    assert sum(1 for c in contents if c) >= 10
    assert len(arrivals) >= 10  # chunk by chunk, not one buffered answer
    assert arrivals[-1] - arrivals[0] > 0.1  # 20 tokens at the int8 profile's ~21 ms each
    assert client.idle_count() == 1  # the stream ended whole: the connection is reused


async def test_tls_with_the_replicas_own_ca(nginx: Nginx, client: UpstreamClient) -> None:
    trusted = ReplicaTls(ca_file=str(nginx.pki.ca)).context
    for _ in range(2):
        response = await client.post(tls_url(nginx.tls_port), "/chat/completions", CHAT, JSON, connect_s=2,
                                     read_s=10, tls=trusted)
        assert response.status == 200 and orjson.loads(await response.read())["choices"]
    assert response.headers["x-connection-requests"] == "2"  # the TLS connection was kept alive
    with pytest.raises(ConnectFailed, match="certificate verify failed"):
        await client.post(tls_url(nginx.tls_port), "/chat/completions", CHAT, JSON, connect_s=2, read_s=10)


async def test_mutual_tls_with_a_client_certificate(nginx: Nginx, client: UpstreamClient) -> None:
    pki = nginx.pki
    identified = ReplicaTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    response = await client.post(tls_url(nginx.mtls_port, "127.0.0.1"), "/chat/completions", CHAT, JSON,
                                 connect_s=2, read_s=10, tls=identified.context)
    assert response.status == 200 and orjson.loads(await response.read())["choices"]
    anonymous = ReplicaTls(ca_file=str(pki.ca)).context
    # the handshake completes (the certificate is optional at the TLS layer) and nginx refuses the request itself:
    # any connection failure here is a failure of the test, not a refusal (it used to return early on one)
    refused = await client.post(tls_url(nginx.mtls_port), "/chat/completions", CHAT, JSON, connect_s=2,
                                read_s=10, tls=anonymous)
    assert refused.status == 400  # nginx: "No required SSL certificate was sent"
    assert b"No required SSL certificate was sent" in await refused.read()


@pytest.mark.skipif(not EARLY_HINTS, reason=f"nginx {'.'.join(map(str, nginx_version())) if NGINX else '-'} has "
                    "no early_hints directive (1.29.0 and later): it passes no 103 on")
async def test_a_103_passed_on_by_nginx_is_read_past(pki: Pki, tmp_path: Path, client: UpstreamClient) -> None:
    """A replica answering 103 Early Hints then its 200, behind nginx's `early_hints`."""

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(replica, "127.0.0.1", 0)
    process, running = start_nginx(tmp_path, server.sockets[0].getsockname()[1], pki)
    try:
        for _ in range(3):
            response = await client.post(running.plain, "/chat/completions", CHAT, JSON, connect_s=2, read_s=10)
            assert (response.status, await response.read()) == (200, b'{"ok":true}')
    finally:
        process.terminate()
        process.wait(10)
        server.close()
