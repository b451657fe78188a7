"""What resuming and sessions add to a request that never breaks (issue 32), in process, A/B in one run.

    .venv/bin/python bench/resume_happy_path.py [--chunks 200000] [--requests 200000]

Per chunk: the SSE scanner keeps the text it forwards (a stream that may be resumed needs it) or not; the rest of
the relay is unchanged. Per request: building the request's resumer (`StreamResumes.for_request`). (Sessions
cost a tenant without a `sessions` policy one attribute test in the route stage: not measured.) Each timed loop runs A and B
alternately, `--rounds` times, in CPU time (time.process_time: the machine is shared); the medians are printed with their difference in microseconds, to read against
the gateway's CPU per request and per chunk (bench/proxy_overhead.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from gateway.backends.pool import Lease, ReplicaPool
from gateway.metrics import GatewayMetrics
from gateway.sse import SseScanner
from gateway.tokens import TokenCounters
from gateway.upstream.resume import StreamResumes
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context

CHUNK = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
         b'"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n')


def _per_chunk(collect: bool, n: int) -> float:
    scanner = SseScanner("chat", forward_usage=False, collect_text=collect)
    feed = scanner.feed
    start = time.process_time()
    for _ in range(n):
        feed(CHUNK)
    if scanner.tally.text is not None:
        "".join(scanner.tally.text)  # what the sink does once at the end
    return (time.process_time() - start) / n * 1e6


def _timed(step: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        step()
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=200_000)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    config = gateway_config([tier("t", ["http://127.0.0.1:9/v1"])])
    ctx = request_context(config, {"model": "t", "messages": [{"role": "user", "content": "hi"}]})
    ctx.body = orjson.loads(ctx.raw_body)
    ctx.tenant = next(iter(config.tenants_by_key_hash.values()))
    ctx.route.tier = config.tiers["t"]
    pool = ReplicaPool()
    pool.configure(config.routes)
    held = Lease(pool, ctx.route.tier.replicas[0], ctx.route.tier, 10, 0, config.routes.balancing)
    resumes = StreamResumes(None, pool, GatewayMetrics(), lambda c: None, TokenCounters())  # type: ignore[arg-type]

    rows: dict[str, list[float]] = {k: [] for k in ("chunk plain", "chunk kept", "resumer")}
    for round_ in range(args.rounds):
        for collect in (False, True) if round_ % 2 else (True, False):  # each first in half the rounds
            rows["chunk kept" if collect else "chunk plain"].append(_per_chunk(collect, args.chunks))
        rows["resumer"].append(_timed(lambda: resumes.for_request(ctx, held), args.requests))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"median of {args.rounds} rounds ({args.chunks:,} chunks, {args.requests:,} requests each)")
    print(f"  scanner per chunk, text not kept:  {med['chunk plain']:.3f} us")
    print(f"  scanner per chunk, text kept:      {med['chunk kept']:.3f} us  (+{med['chunk kept'] - med['chunk plain']:.3f} us)")
    print(f"  resumer per streamed request:      {med['resumer']:.3f} us")


if __name__ == "__main__":
    main()
