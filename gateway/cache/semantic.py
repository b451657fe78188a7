"""Semantic index in Redis itself: one vector set per namespace, `sem:{namespace}`.

`detect()` finds what the server offers: "vectorset" (Redis 8's VADD/VSIM, used here), "search"
(RediSearch FT.*: detected but not supported, logged), or None. Without "vectorset" every call is a
no-op returning None. `add` is one pipeline (VADD ... Q8 + EXPIRE: the set lives `ttl_s` after its
last write; elements do not expire one by one, so the caller checks the response key still exists
and may `remove` a stale one); `nearest` is one VSIM ... WITHSCORES COUNT 1, whose score
(1 + cos) / 2 is turned back into the cosine. The braces make the namespace a Cluster hash tag.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import structlog
from redis.exceptions import ResponseError

from gateway.cache.guard import RedisGuard

Capability = Literal["vectorset", "search"]
REDETECT_S = 30.0  # while detection could not reach Redis, try again this often

log = structlog.get_logger("gateway.redis")


def index_key(namespace: str) -> str:
    """The vector set of one namespace (gateway.cache.keys.semantic_namespace: it names the tenant scope)."""
    return f"sem:{{{namespace}}}"


def top_hit(reply: Any) -> tuple[str, float] | None:
    """(element, cosine) from a VSIM WITHSCORES reply: a flat RESP2 list or a parsed mapping."""
    if isinstance(reply, dict):
        if not reply:
            return None
        element, score = next(iter(reply.items()))
    elif isinstance(reply, list) and len(reply) >= 2:
        element, score = reply[0], reply[1]
    else:
        return None
    name = element.decode() if isinstance(element, bytes) else str(element)
    return name, 2.0 * float(score) - 1.0


class SemanticIndex:
    """Nearest cached prompt by embedding, per namespace (tenant, tier, output-changing params)."""

    def __init__(self, guard: RedisGuard, *, detect_timeout_s: float = 0.5, op_timeout_s: float | None = None) -> None:
        self.guard = guard
        self.detect_timeout_s = detect_timeout_s
        self.op_timeout_s = op_timeout_s  # None: the guard's
        self.capability: Capability | None = None
        self._redetect_at: float | None = 0.0  # None once detection got an answer

    @property
    def available(self) -> bool:
        return self.capability == "vectorset"

    async def _probe(self, command: str, *args: str) -> bool | None:
        """True if the server knows `command`, False if not, None if Redis did not answer."""
        client = self.guard.client

        async def call() -> bool:
            try:
                await client.execute_command(command, *args)
            except ResponseError as err:
                if "unknown command" in str(err).lower():
                    return False
            return True

        return await self.guard.run("semantic_detect", call, self.detect_timeout_s)

    async def detect(self) -> Capability | None:
        """Find and remember the server's vector capability (call once at start-up)."""
        has_vset = await self._probe("VCARD", "sem:{detect}")
        if has_vset is None:
            self._redetect_at = time.monotonic() + REDETECT_S
            log.warning("semantic_index_unavailable", reason="redis did not answer; will retry")
            return None
        self._redetect_at = None
        if has_vset:
            self.capability = "vectorset"
        elif await self._probe("FT._LIST"):
            self.capability = "search"
            log.warning("semantic_index_unavailable", reason="server has RediSearch (FT.*) but no vector sets; "
                        "only vector sets are supported")
        else:
            log.warning("semantic_index_unavailable", reason="server has neither vector sets nor RediSearch")
        return self.capability

    async def _ready(self) -> bool:
        if self.capability == "vectorset":
            return True
        if self._redetect_at is not None and time.monotonic() >= self._redetect_at:
            self._redetect_at = time.monotonic() + REDETECT_S  # one detection at a time
            await self.detect()
        return self.available

    async def add(self, namespace: str, key: str, vector: npt.NDArray[Any], ttl_s: int) -> None:
        """Index `vector` under element `key` in the namespace's set; refresh the set's TTL."""
        if not await self._ready():
            return
        blob = np.asarray(vector, dtype="<f4").tobytes()
        name = index_key(namespace)

        async def call() -> list[Any]:
            async with self.guard.client.pipeline(transaction=False) as pipe:
                pipe.execute_command("VADD", name, "FP32", blob, key, "Q8")
                pipe.expire(name, ttl_s)
                result: list[Any] = await pipe.execute()
                return result

        await self.guard.run("semantic_add", call, self.op_timeout_s, key=name)

    async def nearest(self, namespace: str, vector: npt.NDArray[Any]) -> tuple[str, float] | None:
        """(key, cosine) of the closest element in the namespace, or None (empty, unavailable, down)."""
        if not await self._ready():
            return None
        blob = np.asarray(vector, dtype="<f4").tobytes()
        client = self.guard.client
        reply = await self.guard.run(
            "semantic_nearest",
            lambda: client.execute_command("VSIM", index_key(namespace), "FP32", blob, "WITHSCORES", "COUNT", 1),
            self.op_timeout_s, key=index_key(namespace),
        )
        return top_hit(reply)

    async def remove(self, namespace: str, key: str) -> None:
        """Drop a stale element (its response expired)."""
        if await self._ready():
            client = self.guard.client
            await self.guard.run("semantic_remove", lambda: client.execute_command("VREM", index_key(namespace), key),
                                 key=index_key(namespace))
