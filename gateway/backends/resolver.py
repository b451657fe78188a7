"""Replica host names resolved once per `ttl_s` (aiohttp's client kept them 10 s: `ttl_dns_cache`), so a
new connection to a replica behind a name costs no DNS round trip each time, and a moved replica is
followed within the TTL.

    cache = DnsCache()
    for family, address in await cache.resolve("vllm-0.internal", 8000):  # IP literals are not looked up
        ...
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

TTL_S = 10.0

Address = tuple[int, str]  # (family, host address)
Lookup = Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]  # getaddrinfo's shape


class DnsCache:
    """Addresses by (host, port), each kept `ttl_s` after its lookup; `forget` drops one that failed."""

    def __init__(self, ttl_s: float = TTL_S, lookup: Lookup | None = None) -> None:
        self.ttl_s = ttl_s
        self._lookup = lookup
        self._entries: dict[tuple[str, int], tuple[float, list[Address]]] = {}

    async def resolve(self, host: str, port: int) -> list[Address]:
        literal = _literal(host)
        if literal is not None:
            return [literal]
        now = time.monotonic()
        entry = self._entries.get((host, port))
        if entry is not None and now < entry[0]:
            return entry[1]
        infos = await (self._lookup or _getaddrinfo)(host, port)
        addresses = list(dict.fromkeys((info[0], info[4][0]) for info in infos))
        if not addresses:
            raise OSError(f"{host} has no address")
        self._entries[(host, port)] = (now + self.ttl_s, addresses)
        return addresses

    def forget(self, host: str, port: int) -> None:
        """None of its addresses answered: look the name up again next time."""
        self._entries.pop((host, port), None)


def _literal(host: str) -> Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host)


async def _getaddrinfo(host: str, port: int) -> list[tuple[Any, ...]]:
    return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
