"""HTTP handlers for /v1/chat/completions and /v1/completions (streaming and not).

Whatever happens to a request after it is accepted, `finally` releases its sequence
from the engine at once (freeing KV) and records it: completed, cancelled (client went
away: handler cancelled or a write failed) or fault (an injected disconnect).
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from .engine import Engine, RequestError
from .faults import FaultDecision
from .parse import BadRequest, GenRequest, Kind, parse_body
from .sequence import Sequence, SeqState
from .stats import Status
from .tokens import output_count
from .wire import DONE, MALFORMED, SSE_HEADERS, StreamFormatter, completion_body, error_response

ENGINE_KEY = web.AppKey("emulator_engine", Engine)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "completion")


async def _serve(request: web.Request, kind: Kind) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    engine.stats.received += 1
    try:
        req = parse_body(await request.read(), kind)
        seq = engine.create(req.prompt, req.prompt_hash, req.max_tokens, ignore_eos=req.ignore_eos,
                            min_tokens=req.min_tokens, request_seed=req.seed, prefill=req.prefill,
                            base_tokens=req.base_tokens)
    except (BadRequest, RequestError) as exc:
        engine.stats.rejected += 1
        return error_response(400, str(exc), "invalid_request_error",
                              param=getattr(exc, "param", None))
    fault = engine.faults.draw()
    if fault.rate_limit or fault.error:
        engine.record_rejection(seq)
        if fault.rate_limit:
            retry = str(max(1, round(engine.faults.config.retry_after_s)))
            return error_response(429, "Rate limit exceeded (emulated)", "rate_limit_error",
                                  code="rate_limit_exceeded", headers={"Retry-After": retry})
        return error_response(500, "Internal server error (emulated)", "server_error")
    rid = ("chatcmpl-emu-" if kind == "chat" else "cmpl-emu-") + format(seq.id, "x")
    if req.stream:
        return await _stream(request, engine, req, seq, fault, rid)
    return await _whole(request, engine, req, seq, fault, rid)


async def _stream(
    request: web.Request, engine: Engine, req: GenRequest, seq: Sequence, fault: FaultDecision,
    rid: str,
) -> web.StreamResponse:
    fmt = StreamFormatter(req.kind, rid, int(time.time()), req.model, req.include_usage)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    limit, sent = _disconnect_at(fault, req), 0
    status: Status = "cancelled"
    try:
        await resp.prepare(request)
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        engine.enqueue(seq)
        while True:
            if limit is not None and sent >= limit:
                status = "fault"
                _drop_connection(request)
                return resp
            n = await seq.wait(sent)
            if n > sent:
                upto = n if limit is None else min(n, limit)
                out = fmt.tokens(seq.output_ids[sent:upto])
                if sent == 0:
                    out = (fmt.role() if fmt.chat else b"") + out + (MALFORMED if fault.malformed else b"")
                sent = upto
                await resp.write(out)
            if seq.state is SeqState.FINISHED and sent >= seq.n_out:
                break
        tail = b"" if fault.omit_finish else fmt.finish(seq.finish_reason)
        if req.include_usage and not fault.omit_usage:
            tail += fmt.usage(seq.prompt_tokens, sent, seq.cached_tokens)
        await resp.write(tail + DONE)
        status = "completed"
        return resp
    except ConnectionError:  # the client went away between two writes
        return resp
    finally:
        engine.release(seq, status, sent)


async def _whole(
    request: web.Request, engine: Engine, req: GenRequest, seq: Sequence, fault: FaultDecision,
    rid: str,
) -> web.StreamResponse:
    status: Status = "cancelled"
    try:
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        engine.enqueue(seq)
        limit = fault.disconnect_after
        if limit is not None and limit < seq.n_out:
            while not seq.done and seq.generated < limit:
                await seq.wait(max(limit - 1, 0))
            status = "fault"
            _drop_connection(request)
            return web.Response(status=500)
        while not seq.done:
            await seq.wait(seq.n_out - 1)
        if fault.malformed:
            body = b'{"id": <<malformed-by-emulator-fault>>'
        else:
            body = completion_body(req.kind, rid, int(time.time()), req.model, seq.output_ids,
                                   seq.finish_reason, seq.prompt_tokens, seq.cached_tokens)
        status = "completed"
        return web.Response(body=body, content_type="application/json")
    finally:
        engine.release(seq, status, seq.generated if status == "completed" else 0)


def _disconnect_at(fault: FaultDecision, req: GenRequest) -> int | None:
    """Tokens of this stream before an injected disconnect. The fault sits at a place in the answer: a request
    continuing an answer (its prefill) counts the prefill's tokens too, so a continuation that starts past
    the place streams on (None: no disconnect)."""
    limit = fault.disconnect_after
    if limit is None or req.prefill is None:
        return limit
    left = limit - (output_count(req.prefill) or 0)
    return left if left > 0 else None


def _drop_connection(request: web.Request) -> None:
    """Close the connection mid-response (no terminating chunk): an injected disconnect."""
    transport = request.transport
    if transport is not None:
        transport.close()
