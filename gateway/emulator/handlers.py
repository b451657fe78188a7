"""HTTP handlers for /v1/chat/completions and /v1/completions (streaming and not).

Whatever happens to a request after it is accepted, `finally` releases its sequence
from the engine at once (freeing KV) and records it: completed, cancelled (client went
away: handler cancelled or a write failed) or fault (an injected disconnect).

A request of one prompt and one choice without logprobs takes the plain path (`_stream`, `_whole`). Several
choices (prompts x n, best_of) or logprobs take `_stream_many` / `_whole_many`: one sequence per prompt and
choice in the engine, released and recorded together as one request; streams interleave the choices' chunks
(one choice per chunk, each choice's own finish chunk, one usage chunk summing them), as vLLM does.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from .engine import Engine, RequestError
from .faults import FaultDecision
from .parse import BadRequest, GenRequest, Kind, parse_body
from .sequence import Group, Sequence, SeqState
from .stats import Status
from .tokens import VOCAB, output_count, token_logprobs
from .wire import (DONE, MALFORMED, SSE_HEADERS, ChoiceFormatter, StreamFormatter, chat_logprobs, choices_body,
                   completion_body, completion_logprobs, error_response)

LogprobEntries = list[tuple[float, list[tuple[int, float]]]]

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
        if not req.single or req.logprobs is not None:
            seqs = engine.create_all(req)
        else:
            seq = engine.create(req.prompt, req.prompt_hash, req.max_tokens, ignore_eos=req.ignore_eos,
                                min_tokens=req.min_tokens, request_seed=req.seed, prefill=req.prefill,
                                base_tokens=req.base_tokens, cache_salt=req.cache_salt)
            seqs = [seq]
    except (BadRequest, RequestError) as exc:
        engine.stats.rejected += 1
        return error_response(400, str(exc), "invalid_request_error",
                              param=getattr(exc, "param", None))
    fault = engine.faults.draw()
    if fault.rate_limit or fault.error:
        engine.record_rejection(seqs)
        if fault.rate_limit:
            retry = str(max(1, round(engine.faults.config.retry_after_s)))
            return error_response(429, "Rate limit exceeded (emulated)", "rate_limit_error",
                                  code="rate_limit_exceeded", headers={"Retry-After": retry})
        return error_response(500, "Internal server error (emulated)", "server_error")
    rid = ("chatcmpl-emu-" if kind == "chat" else "cmpl-emu-") + format(seqs[0].id, "x")
    if len(seqs) > 1 or req.logprobs is not None:
        group = Group(seqs)
        if req.stream and req.best_of == req.n:
            return await _stream_many(request, engine, req, group, fault, rid)
        return await _whole_many(request, engine, req, group, fault, rid)
    seq = seqs[0]
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


def _logprobs(req: GenRequest, seq: Sequence) -> LogprobEntries | None:
    return None if req.logprobs is None else token_logprobs(seq.choice_hash, seq.output_ids, req.logprobs)


def _owners(group: Group) -> tuple[int, int]:
    """Prompt and cached tokens of the request: each prompt once (its first sequence's)."""
    owners = [s for s in group.seqs if s.index == 0]
    return sum(s.prompt_tokens for s in owners), sum(s.cached_tokens for s in owners)


async def _stream_many(
    request: web.Request, engine: Engine, req: GenRequest, group: Group, fault: FaultDecision, rid: str,
) -> web.StreamResponse:
    """Stream several choices: the tokens each step made, choice by choice in index order (so chunks of different
    choices interleave), a choice's finish chunk right after its last token, one usage chunk at the end."""
    fmt = ChoiceFormatter(req.kind, rid, int(time.time()), req.model, req.include_usage)
    seqs = group.seqs
    lps = [_logprobs(req, s) for s in seqs]
    offsets = [0] * len(seqs)  # completions' text_offset per choice
    resp = web.StreamResponse(headers=SSE_HEADERS)
    limit, total = _disconnect_at(fault, req), 0
    sent = [0] * len(seqs)
    status: Status = "cancelled"
    malformed = fault.malformed
    try:
        await resp.prepare(request)
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        for seq in seqs:
            engine.enqueue(seq)
        if fmt.chat:
            await resp.write(b"".join(fmt.role(i) for i in range(len(seqs))))
        while True:
            out: list[bytes] = []
            moved = True
            while moved and (limit is None or total < limit):
                moved = False
                for i, seq in enumerate(seqs):
                    k = sent[i]
                    if k >= seq.generated or (limit is not None and total >= limit):
                        continue
                    tok = seq.output_ids[k]
                    out.append(fmt.token(i, tok, _chunk_logprobs(req, lps[i], tok, k, offsets[i])))
                    offsets[i] += len(VOCAB[tok])
                    sent[i] = k + 1
                    total += 1
                    moved = True
                    if sent[i] == seq.n_out and not fault.omit_finish:
                        out.append(fmt.finish(i, seq.finish_reason))
            if out:
                if malformed:
                    out.append(MALFORMED)
                    malformed = False
                await resp.write(b"".join(out))
                continue
            if limit is not None and total >= limit:
                status = "fault"
                _drop_connection(request)
                return resp
            if all(sent[i] >= s.n_out for i, s in enumerate(seqs)):
                break
            await group.changed()
        tail = b""
        if req.include_usage and not fault.omit_usage:
            prompt, cached = _owners(group)
            tail = fmt.usage(prompt, total, cached)
        await resp.write(tail + DONE)
        status = "completed"
        return resp
    except ConnectionError:  # the client went away between two writes
        return resp
    finally:
        engine.release_all(seqs, status, total)


def _chunk_logprobs(req: GenRequest, entries: LogprobEntries | None, tok: int, k: int,
                    offset: int) -> dict[str, object] | None:
    if entries is None:
        return None
    if req.kind == "chat":
        return chat_logprobs(entries[k:k + 1], [tok])
    return completion_logprobs(entries[k:k + 1], [tok], offset)


async def _whole_many(
    request: web.Request, engine: Engine, req: GenRequest, group: Group, fault: FaultDecision, rid: str,
) -> web.StreamResponse:
    """Wait for every sequence; answer n choices per prompt (with best_of > n, the n of highest cumulative
    logprob, as vLLM v0), indexed prompt_i * n + j. A stream asked with best_of > n gets the whole body as one
    event, as vLLM sends it."""
    seqs = group.seqs
    status: Status = "cancelled"
    returned = 0
    try:
        if fault.stall_s:
            await asyncio.sleep(fault.stall_s)
        for seq in seqs:
            engine.enqueue(seq)
        limit = fault.disconnect_after
        while not group.done:
            if limit is not None and sum(s.generated for s in seqs) >= limit:
                status = "fault"
                _drop_connection(request)
                return web.Response(status=500)
            await group.changed()
        choices: list[tuple[list[int], str, dict[str, object] | None]] = []
        per = req.best_of
        for start in range(0, len(seqs), per):
            scored = [(s, token_logprobs(s.choice_hash, s.output_ids, req.logprobs or 0)
                       if req.logprobs is not None or per > req.n else []) for s in seqs[start:start + per]]
            if per > req.n:  # best_of: the n of highest cumulative logprob
                scored = sorted(scored, key=lambda p: -sum(lp for lp, _ in p[1]))[:req.n]
            for s, entries in scored:
                lp: dict[str, object] | None = None
                if req.logprobs is not None:
                    lp = (chat_logprobs(entries, s.output_ids) if req.kind == "chat"
                          else completion_logprobs(entries, s.output_ids))
                choices.append((s.output_ids, s.finish_reason, lp))
        returned = sum(len(ids) for ids, _, _ in choices)
        if fault.malformed:
            body = b'{"id": <<malformed-by-emulator-fault>>'
        else:
            prompt, cached = _owners(group)
            body = choices_body(req.kind, rid, int(time.time()), req.model, choices, prompt, cached)
        status = "completed"
        if req.stream:  # best_of > n: not streamed, one event (vLLM's fake stream)
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(b"data: " + body + b"\n\n" + DONE)
            return resp
        return web.Response(body=body, content_type="application/json")
    finally:
        engine.release_all(seqs, status, returned)
