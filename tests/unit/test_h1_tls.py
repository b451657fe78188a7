"""Per-replica TLS (issue 29): a replica's own CA bundle, client certificate and verify switch from the routes
file, refused at load with the field and the reason when a file does not load."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.backends.h1 import ConnectFailed, UpstreamClient, UpstreamClosed
from gateway.config.loader import ConfigError, load_routes
from gateway.config.routes import ReplicaTls
from tests.unit.h1_certs import Pki, make_pki
from tests.unit.h1_scripted import JSON, answer, client  # noqa: F401 (a fixture)

pytestmark = pytest.mark.both_loops
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def serve_tls(context: ssl.SSLContext) -> tuple[asyncio.Server, int]:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(answer(b'{"tls":true}'))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


async def test_a_replica_signed_by_its_own_ca_is_trusted_with_its_ca_file(pki: Pki, client: UpstreamClient) -> None:
    server, port = await serve_tls(pki.server_context())
    try:
        trusted = ReplicaTls(ca_file=str(pki.ca)).context
        for host in ("127.0.0.1", "localhost"):
            response = await client.post(f"https://{host}:{port}/v1", "/x", b"{}", JSON, connect_s=2, read_s=2,
                                         tls=trusted)
            assert await response.read() == b'{"tls":true}'
        with pytest.raises(ConnectFailed, match="certificate verify failed"):
            await client.post(f"https://127.0.0.1:{port}/v1", "/x", b"{}", JSON, connect_s=2, read_s=2)
        unchecked = ReplicaTls(verify=False).context
        response = await client.post(f"https://127.0.0.1:{port}/v1", "/x", b"{}", JSON, connect_s=2, read_s=2,
                                     tls=unchecked)
        assert await response.read() == b'{"tls":true}'
    finally:
        server.close()


async def test_a_replica_that_requires_a_client_certificate_gets_the_configured_one(
        pki: Pki, client: UpstreamClient) -> None:
    server, port = await serve_tls(pki.server_context(require_client_cert=True))
    url = f"https://localhost:{port}/v1"
    try:
        identified = ReplicaTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2, tls=identified.context)
        assert await response.read() == b'{"tls":true}'
        anonymous = ReplicaTls(ca_file=str(pki.ca)).context
        with pytest.raises((ConnectFailed, UpstreamClosed)):
            await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2, tls=anonymous)
    finally:
        server.close()


def routes_with(tmp_path: Path, tls: dict[str, Any], url: str = "https://vllm.internal:8000/v1") -> Path:
    data = yaml.safe_load((ROOT / "routes/emulator.yaml").read_text())
    replica = data["tiers"][0]["replicas"][0]
    replica.pop("launch", None)
    replica.update(url=url, tls=tls)
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_tls_files_are_checked_at_load_with_field_and_reason(pki: Pki, tmp_path: Path) -> None:
    routes = load_routes(routes_with(tmp_path, {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert),
                                                "key_file": str(pki.client_key)}))
    replica = routes.tiers[0].replicas[0]
    assert replica.tls is not None and replica.tls_context is replica.tls.context
    cases = [
        ({"ca_file": str(tmp_path / "missing.pem")}, "tls.ca_file", "no file"),
        ({"ca_file": str(pki.client_key)}, "tls.ca_file", "cannot load"),
        ({"cert_file": str(pki.client_cert)}, "tls", "together"),
        ({"cert_file": str(pki.client_cert), "key_file": str(pki.server_key)}, "tls", "cannot load"),
        ({"verify": "sometimes"}, "tls.verify", "bool"),
    ]
    for tls, field, reason in cases:
        with pytest.raises(ConfigError) as refused:
            load_routes(routes_with(tmp_path, tls))
        issue = refused.value.issues[0]
        assert issue.field.endswith(field) and reason in issue.reason, issue
        assert issue.file.endswith("routes.yaml")
    with pytest.raises(ConfigError, match="https:// replicas only"):
        load_routes(routes_with(tmp_path, {"verify": False}, url="http://vllm.internal:8000/v1"))
