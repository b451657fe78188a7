"""Proxy: the request's answer from its tier's replicas, through the upstream hop (`gateway.upstream`): the
candidates in rank order until one answers (failover before the first byte), then the answer whole or relayed
chunk by chunk (the output cap mid-stream; after the first byte, a broken stream goes on from another replica)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from gateway.context import RequestContext
from gateway.types import Reply
from gateway.upstream.hop import UpstreamHop


class ProxyStage:
    def __init__(self, hop: UpstreamHop) -> None:
        self.hop = hop

    def __call__(self, ctx: RequestContext) -> Coroutine[Any, Any, Reply]:
        return self.hop.answer(ctx)  # the hop's coroutine itself: no frame around it
