"""Issue 18: the fault matrix (docs/FAULTS.md) once against the real llama.cpp tiers, not the emulator.

    .venv/bin/python bench/faults_real.py [--read-timeout 3]

Starts `gateway up` (what `make run` runs) on routes/local.yaml + policies/local.yaml with the replicas
moved to free loopback ports, twice: first on a routes copy with a short `upstream.read_timeout_s` (the
frozen-replica rows b, b2, and row s: a killed replica restarted by `gateway up`), then on the shipped
values with `--no-restart` (all other rows: a killed replica stays dead). Faults go to the real child
processes of that `gateway up` (found under /proc by parent pid): the llama.cpp servers (SIGKILL,
SIGSTOP/SIGCONT) and the embedded Redis (SIGSTOP under traffic). Clients: the official `openai` SDK;
aiohttp for the hostile raw bodies of issue 18 items 6-8. Each row: what the client received, the request
log line (status · outcome / error), whether the gateway kept serving (/healthz 200,
gateway_requests_in_flight 0), against what docs/FAULTS.md promises. Destructive rows (replicas killed)
come last. About a minute on 2 vCPUs; bounded at 2 minutes per gateway. Exit 1 when a row is a finding.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import yaml
from openai import AsyncOpenAI

from gateway.bench.procs import free_port
from gateway.bench.report import ROOT
from gateway.bench.readers import log_lines, read_log
from gateway.testing import wait_ready

AUTH = {"Authorization": "Bearer sk-demo"}
LONG_PROMPT = "Write a long story about a lighthouse keeper, with many chapters and details."
LOG_WAIT_S = 8.0
RUN_BOUND_S = 120.0  # per gateway (start-up included): two gateways, the whole run stays under 5 minutes
AFFINE_PREFIX = ("You are a terse assistant for a hardware shop. Answer in one short sentence, no lists, no "
                 "preamble, and never repeat the question. The customer asks:")  # > 2 prefix blocks of 64 chars


@dataclass
class Row:
    case: str
    fault: str
    promised: str  # docs/FAULTS.md
    client: str = ""
    log: str = ""
    serving: str = ""
    findings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "as documented" if not self.findings else "**FINDING**: " + "; ".join(dict.fromkeys(self.findings))


@dataclass
class StreamResult:
    request_id: str
    backend: str
    chunks: int  # chunks with content
    finish: list[str]
    error: str | None  # the SDK's exception, if any


class Gateway:
    """`gateway up` in a temp dir, and its child processes by port."""

    def __init__(self, read_timeout_s: float | None, restart: bool) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="faults-real-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        routes = yaml.safe_load((ROOT / "routes/local.yaml").read_text())
        if read_timeout_s is not None:  # else the shipped value
            routes["upstream"]["read_timeout_s"] = read_timeout_s
        self.read_timeout_s: float = routes["upstream"]["read_timeout_s"]
        self.replica_ports: dict[str, int] = {}
        for tier in routes["tiers"]:
            for replica in tier.get("replicas", []):  # an in-process tier (embeddings) has none
                self.replica_ports[replica["name"]] = port = free_port()
                replica["url"] = f"http://127.0.0.1:{port}/v1"
        (self.work / "routes.yaml").write_text(yaml.safe_dump(routes))
        self.command = [sys.executable, "-m", "gateway", "up", "--routes", str(self.work / "routes.yaml"),
                        "--policies", str(ROOT / "policies/local.yaml"), "--port", str(self.port),
                        "--log-file", str(self.work / "requests.log"), "--backend-logs", str(self.work / "backends"),
                        *([] if restart else ["--no-restart"])]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stderr=(self.work / "gateway.err").open("wb"))

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)  # `gateway up` stops its llama.cpp servers and Redis
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def children(self) -> list[tuple[int, list[str]]]:
        """(pid, argv) of each direct child of the `gateway up` process, from /proc."""
        assert self.process is not None
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.process.pid:
                found.append((int(entry.name), [arg.decode() for arg in argv if arg]))
        return found

    def replica_pid(self, name: str) -> int:
        port = str(self.replica_ports[name])
        for pid, argv in self.children():
            if argv and argv[0].endswith("llama-server") and argv[argv.index("--port") + 1] == port:
                return pid
        raise LookupError(f"no llama.cpp server of {name} (port {port}) under pid {self.process_pid}")

    def redis_pid(self) -> int:
        for pid, argv in self.children():
            if argv and "redis-server" in argv[0].split(" ")[0]:
                return pid
        raise LookupError(f"no redis-server under pid {self.process_pid}")

    @property
    def process_pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def lines(self, ids: set[str]) -> dict[str, dict[str, Any]]:
        return log_lines(self.work / "requests.log", ids, LOG_WAIT_S)

    def events(self, name: str, request_id: str | None = None) -> list[dict[str, Any]]:
        """Operational log events (`upstream_attempt_failed`, `redis_unavailable`, ...) from the log file."""
        return [line for line in read_log(self.work / "requests.log") if line.get("event") == name
                and (request_id is None or line.get("request_id") == request_id)]


def describe(line: dict[str, Any] | None) -> str:
    if line is None:
        return "no request log line"
    text = f"{line['status']} · {line['outcome']} / {line['error']}"
    extra = [f"backend {line['backend']}", f"attempts {line['attempts']}"] if line["backend"] else []
    extra += [f"tokens {line['prompt_tokens']}+{line['completion_tokens']}", f"${line['cost_usd']:.9f}"]
    if line.get("cache"):
        extra.append(f"cache {line['cache']}")
    if line.get("resumed"):
        extra.append("resumed")
    return f"{text} ({', '.join(extra)})"


def expect(row: Row, line: dict[str, Any] | None, status: int, outcome: str, error: str | None) -> None:
    if line is None:
        row.findings.append("no request log line")
    elif (line["status"], line["outcome"], line["error"]) != (status, outcome, error):
        row.findings.append(f"log {line['status']} · {line['outcome']} / {line['error']}, documented "
                            f"{status} · {outcome} / {error}")


async def serving(session: aiohttp.ClientSession, url: str, row: Row) -> None:
    """/healthz 200 and gateway_requests_in_flight back to 0 (a handler may settle a moment late)."""
    async with session.get(f"{url}/healthz") as response:
        health = response.status
    in_flight = -1.0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        async with session.get(f"{url}/metrics") as response:
            match = re.search(r"^gateway_requests_in_flight (\S+)$", await response.text(), re.MULTILINE)
        in_flight = float(match.group(1)) if match else -1.0
        if in_flight == 0:
            break
        await asyncio.sleep(0.2)
    row.serving += f"healthz {health}, in_flight {in_flight:g}"
    if health != 200 or in_flight != 0:
        row.findings.append(f"not serving cleanly: healthz {health}, in_flight {in_flight:g}")


async def in_ranking(session: aiohttp.ClientSession, url: str, names: list[str], timeout_s: float = 15.0) -> float:
    """Seconds until every replica of `names` is healthy with a closed circuit (/metrics); -1 if not in time."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
        if all(f'gateway_replica_healthy{{backend="{name}"}} 1.0' in text
               and f'gateway_replica_circuit_state{{backend="{name}"}} 0.0' in text for name in names):
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    return -1.0


async def sdk_stream(client: AsyncOpenAI, model: str, max_tokens: int, prompt: str, *, stop_after: int | None = None,
                     on_chunk: Callable[[int, str], Awaitable[None]] | None = None) -> StreamResult:
    """Stream with the SDK; `on_chunk(n, backend)` after each content chunk; hang up after `stop_after` chunks."""
    stream = await client.chat.completions.create(
        model=model, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": prompt}])
    headers = stream.response.headers
    result = StreamResult(headers["x-request-id"], headers.get("x-gateway-backend", "?"), 0, [], None)
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                result.finish.append(chunk.choices[0].finish_reason)
            if chunk.choices and chunk.choices[0].delta.content:
                result.chunks += 1
                if on_chunk is not None:
                    await on_chunk(result.chunks, result.backend)
                if stop_after is not None and result.chunks >= stop_after:
                    await stream.close()  # the client hangs up mid-stream
                    break
    except openai.APIError as err:
        code = err.body.get("code") if isinstance(err.body, dict) else None
        result.error = f"{type(err).__name__} code={code}: {err.message}"
    return result


def stream_text(result: StreamResult) -> str:
    text = f"200, {result.chunks} content chunks"
    if result.finish:
        text += f", finish {'/'.join(result.finish)}"
    return text + (f", then `{result.error}`" if result.error else ", no error")


async def sdk_json(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int = 8,
                   temperature: float | None = None) -> tuple[int, str, str, str]:
    """(status, request id, backend, what the client got) of one non-streaming SDK call."""
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": prompt}],
            temperature=openai.omit if temperature is None else temperature)
    except openai.APIStatusError as err:
        body = err.body if isinstance(err.body, dict) else {}
        text = f"{err.status_code} {body.get('type')} `{body.get('code')}`: {body.get('message')}"
        if "retry-after" in err.response.headers:
            text += f" (Retry-After {err.response.headers['retry-after']})"
        return err.status_code, err.response.headers.get("x-request-id", ""), "", text
    headers = raw.headers
    cache = headers.get("x-gateway-cache")
    return (raw.status_code, headers["x-request-id"], headers.get("x-gateway-backend", "?"),
            f"200{' cache ' + cache if cache else ''}")


# (a) ------------------------------------------------------------------------------------------------
async def killed_mid_stream(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession) -> Row:
    row = Row("a", "replica SIGKILLed mid-stream (large-f16-a, the tier's only replica)",
              "200, tokens so far, then error event `upstream_stream_broken` (reset) or `upstream_stream_truncated` "
              "(ends without [DONE]); log 200 · upstream_error / same, tokens counted")
    pid = gw.replica_pid("large-f16-a")

    async def kill(n: int, backend: str) -> None:
        if n == 3:
            os.kill(pid, signal.SIGKILL)

    result = await sdk_stream(client, "large-f16", 200, LONG_PROMPT, on_chunk=kill)
    line = gw.lines({result.request_id}).get(result.request_id)
    row.client, row.log = stream_text(result), describe(line)
    if result.chunks < 3:
        row.findings.append(f"fault not injected: the stream ended after {result.chunks} chunks")
    error = line["error"] if line else None
    if error not in ("upstream_stream_broken", "upstream_stream_truncated"):
        row.findings.append(f"log error {error}")
    else:
        expect(row, line, 200, "upstream_error", error)
    if result.error is None or (error or "?") not in result.error:
        row.findings.append("the client got no error event naming it")
    if line is not None and line["completion_tokens"] < result.chunks:
        row.findings.append("fewer tokens logged than the client received")
    await serving(session, gw.url, row)
    return row


# (b) ------------------------------------------------------------------------------------------------
async def frozen_mid_stream(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession,
                            read_timeout_s: float) -> Row:
    row = Row("b", f"replica SIGSTOPped mid-stream, longer than read_timeout_s ({read_timeout_s:g} s), then SIGCONT",
              "resumed on the other replica (Mid-stream failover): 200 to the end, log 200 · ok, resumed; else 200, "
              "tokens so far, then error event `upstream_idle_timeout`; log 200 · upstream_error / "
              "upstream_idle_timeout")
    frozen: list[int] = []

    async def freeze(n: int, backend: str) -> None:
        if n == 3:
            frozen.append(gw.replica_pid(backend))
            os.kill(frozen[0], signal.SIGSTOP)

    started = time.monotonic()
    try:
        result = await asyncio.wait_for(sdk_stream(client, "small-q4", 200, LONG_PROMPT, on_chunk=freeze),
                                        read_timeout_s + 20)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    waited = time.monotonic() - started
    if not frozen:
        row.findings.append(f"fault not injected: the stream ended after {result.chunks} chunks")
    line = gw.lines({result.request_id}).get(result.request_id)
    row.client = stream_text(result) + f" ({waited:.1f} s in all)"
    row.log = describe(line)
    if line is not None and line.get("resumed"):  # continued on the other replica from the text already sent
        expect(row, line, 200, "ok", None)
        if result.error is not None:
            row.findings.append(f"resumed, yet the client got an error event: {result.error}")
    else:
        expect(row, line, 200, "upstream_error", "upstream_idle_timeout")
        if result.error is None or "upstream_idle_timeout" not in result.error:
            row.findings.append("the client got no `upstream_idle_timeout` event")
    # after SIGCONT the server answers again (directly, and through the gateway once its health probe passes)
    async with session.get(f"http://127.0.0.1:{gw.replica_ports[result.backend]}/v1/models") as response:
        row.serving = f"{result.backend} after SIGCONT: /v1/models {response.status}; "
    status, _, _, _ = await sdk_json(client, "small-q4", "Say hi.")
    row.serving += f"next small-q4 request {status}; "
    back_s = await in_ranking(session, gw.url, [result.backend])
    row.serving += (f"{result.backend} back in the ranking (health probe) after {back_s:.1f} s; " if back_s >= 0 else
                    f"{result.backend} not back in the ranking after 15 s; ")
    await serving(session, gw.url, row)
    return row


async def frozen_before(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession,
                        read_timeout_s: float) -> Row:
    row = Row("b2", f"large-f16-a (the tier's only replica) SIGSTOPped before a JSON and a streamed request, "
              f"then SIGCONT (read_timeout_s {read_timeout_s:g} s)",
              "stalls before the first byte: 504 `upstream_error`, \"sent no first byte in time\"; log 504 · "
              "upstream_error / upstream_error")
    if await in_ranking(session, gw.url, ["large-f16-a"]) < 0:
        row.findings.append("precondition: large-f16-a not in the ranking")
    pid = gw.replica_pid("large-f16-a")
    os.kill(pid, signal.SIGSTOP)  # the kernel still accepts connections: nothing answers
    try:
        results = await asyncio.gather(sdk_json(client, "large-f16", "Name a city."),
                                       sdk_stream(client, "large-f16", 8, "Name a town."), return_exceptions=True)
    finally:
        os.kill(pid, signal.SIGCONT)
    texts, ids = [], []
    for result in results:
        if isinstance(result, openai.APIStatusError):  # the streamed request: refused before the stream
            body = result.body if isinstance(result.body, dict) else {}
            texts.append(f"{result.status_code} {body.get('type')}: {body.get('message')}")
            ids.append(result.response.headers.get("x-request-id", ""))
        elif isinstance(result, tuple):
            texts.append(result[3])
            ids.append(result[1])
        else:
            texts.append(repr(result))
    lines = gw.lines(set(ids))
    row.client = "JSON: " + " / stream: ".join(texts)
    row.log = "; ".join(describe(lines.get(request_id)) for request_id in ids)
    for text, request_id in zip(texts, ids):
        expect(row, lines.get(request_id), 504, "upstream_error", "upstream_error")
        if not text.startswith("504"):
            row.findings.append(f"client got {text[:40]}")
        elif "sent no first byte in time" not in text:
            row.findings.append(f"message says {text.split(': ', 1)[-1]!r}, documented \"sent no first byte in time\"")
    back_s = await in_ranking(session, gw.url, ["large-f16-a"])
    row.serving = f"large-f16-a back in the ranking after {back_s:.1f} s; " if back_s >= 0 else "not back in 15 s; "
    await serving(session, gw.url, row)
    return row


# (c) ------------------------------------------------------------------------------------------------
async def refused(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession) -> list[Row]:
    failover = Row("c1", "small-q4-a SIGKILLed, then 3 concurrent requests to small-q4, two with a prompt prefix "
                   "small-q4-a served (prefix affinity sends them there first), before the health probe",
                   "failover before the first byte: 200 from small-q4-b; `upstream_attempt_failed` for small-q4-a; "
                   "log 200 · ok, attempts 2")
    if await in_ranking(session, gw.url, ["small-q4-a", "small-q4-b"]) < 0:
        failover.findings.append("precondition: small-q4-a and -b not both in the ranking after 15 s")
    affine = ""
    for i in range(8):  # a prompt prefix that small-q4-a holds
        prompt = f"Conversation {i}. {AFFINE_PREFIX}"
        _, _, backend, _ = await sdk_json(client, "small-q4", f"{prompt} Name a colour.")
        if backend == "small-q4-a":
            affine = prompt
            break
    if not affine:
        failover.findings.append("precondition: no prompt of 8 landed on small-q4-a")
    os.kill(gw.replica_pid("small-q4-a"), signal.SIGKILL)
    prompts = [f"{affine} Name a fruit.", f"{affine} Name a tree.", "Name a river."]
    answers = await asyncio.gather(*(sdk_json(client, "small-q4", p) for p in prompts))
    lines = gw.lines({request_id for _, request_id, _, _ in answers})
    failover.client = ", ".join(f"{text}{' from ' + backend if backend else ''}" for _, _, backend, text in answers)
    failover.log = "; ".join(describe(lines.get(request_id)) for _, request_id, _, _ in answers)
    for status, request_id, _, _ in answers:
        if status != 200:
            failover.findings.append(f"a client got {status}")
        expect(failover, lines.get(request_id), 200, "ok", None)
    retried = [line for line in lines.values() if line["attempts"] > 1]
    failed = [e for _, request_id, _, _ in answers for e in gw.events("upstream_attempt_failed", request_id)]
    failover.log += f"; {len(failed)} `upstream_attempt_failed` ({', '.join(e['reason'] for e in failed)})"
    if not retried:
        failover.findings.append("no request was sent to the stopped replica first (failover not exercised)")
    await serving(session, gw.url, failover)

    none = Row("c2", "small-q4-b SIGKILLed too, then a request to small-q4 (no replica left, before the probe)",
               "502 `upstream_error`, \"backend … is unreachable\"; log 502 · upstream_error / upstream_error")
    os.kill(gw.replica_pid("small-q4-b"), signal.SIGKILL)
    status, request_id, _, text = await sdk_json(client, "small-q4", "Name a fruit.")
    line = gw.lines({request_id}).get(request_id)
    none.client, none.log = text, describe(line)
    if status != 502:
        none.findings.append(f"client got {status}")
    expect(none, line, 502, "upstream_error", "upstream_error")
    await serving(session, gw.url, none)

    probed = Row("c3", "every replica of a tier dead and out of the ranking (health probe, 6 s on): small-q4, "
                 "large-f16", "503 `overloaded_error` `no_replica_available` + `Retry-After`; log 503 · rejected / "
                 "no_replica_available (backend table; docs/OPERATIONS.md)")
    await asyncio.sleep(6.0)  # balancing.health_interval_s 5 s: the probe takes them out of the ranking
    results = [await sdk_json(client, model, "Name a tree.") for model in ("small-q4", "large-f16")]
    probe_lines = gw.lines({request_id for _, request_id, _, _ in results})
    probed.client = "; ".join(text for _, _, _, text in results)
    probed.log = "; ".join(describe(probe_lines.get(request_id)) for _, request_id, _, _ in results)
    for status, request_id, _, text in results:
        expect(probed, probe_lines.get(request_id), 503, "rejected", "no_replica_available")
        if status != 503 or "Retry-After" not in text:
            probed.findings.append(f"client got {text}")
    await serving(session, gw.url, probed)
    return [failover, none, probed]


# (s) ------------------------------------------------------------------------------------------------
async def restarted(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession) -> Row:
    row = Row("s", "large-f16-a (the tier's only replica) SIGKILLed while idle, under `gateway up`'s supervision",
              "console: exited with code -9, restarting in 1 s, restarted, healthy again; log `backend_exited`; "
              "back in the ranking; the next large-f16 request 200")
    pid = gw.replica_pid("large-f16-a")
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    console = gw.work / "gateway.err"
    while "backend large-f16-a is healthy again" not in console.read_text() and time.monotonic() - started < 60:
        await asyncio.sleep(0.2)
    healthy_s = time.monotonic() - started
    said = [line.split("gateway up: ", 1)[1] for line in console.read_text().splitlines()
            if line.startswith("gateway up: backend large-f16-a")]
    ranked_s = await in_ranking(session, gw.url, ["large-f16-a"])
    status, request_id, backend, text = await sdk_json(client, "large-f16", "Name a colour.")
    row.client = f"{text} from {backend}, after the console said: " + "; ".join(said)
    row.log = f"{len(gw.events('backend_exited'))} `backend_exited`; " + describe(gw.lines({request_id}).get(request_id))
    row.serving = f"restarted and healthy {healthy_s:.1f} s after the kill, in the ranking {ranked_s:.1f} s later; "
    if not said or "exited with code -9" not in said[0] or "healthy again" not in said[-1]:
        row.findings.append("the console did not say exited / restarted / healthy again")
    if gw.replica_pid("large-f16-a") == pid or ranked_s < 0 or status != 200:
        row.findings.append(f"not back: pid {gw.replica_pid('large-f16-a')}, ranked {ranked_s:.1f}, status {status}")
    await serving(session, gw.url, row)
    return row


# (d) ------------------------------------------------------------------------------------------------
async def hang_up(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession) -> Row:
    row = Row("d", "client hangs up mid-stream (SDK reads 3 content chunks, stops reading 0.5 s, `stream.close()`)",
              "log 499 · client_disconnected, priced for the tokens read from the backend, forwarded or not")

    async def pause(n: int, backend: str) -> None:
        if n == 3:
            await asyncio.sleep(0.5)

    result = await sdk_stream(client, "small-q4", 200, LONG_PROMPT, stop_after=3, on_chunk=pause)
    line = gw.lines({result.request_id}).get(result.request_id)
    row.client = f"200, {result.chunks} content chunks read, then the client closed the stream"
    row.log = describe(line)
    expect(row, line, 499, "client_disconnected", None)
    if line is not None and (line["completion_tokens"] < result.chunks or line["cost_usd"] <= 0):
        row.findings.append("not priced for the tokens read")
    await serving(session, gw.url, row)
    return row


# (e) ------------------------------------------------------------------------------------------------
async def redis_frozen(gw: Gateway, client: AsyncOpenAI, session: aiohttp.ClientSession) -> Row:
    row = Row("e", "Redis SIGSTOPped under traffic (8 requests, 2 at a time), then SIGCONT",
              "200s throughout, no cache hits while frozen, hits after SIGCONT; `redis_unavailable`; "
              "/readyz 200 `\"redis\": \"down\"` while frozen, `up` after")
    prompt, pid = "Name a planet.", gw.redis_pid()
    warm = [await sdk_json(client, "small-q4", prompt, temperature=0) for _ in range(2)]
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        gate = asyncio.Semaphore(2)

        async def one(i: int) -> tuple[int, str, str, str]:
            async with gate:
                if i % 2:
                    result = await sdk_stream(client, "small-q4", 8, f"{prompt} ({i})")
                    return 200 if result.error is None else 0, result.request_id, result.backend, stream_text(result)
                return await sdk_json(client, "small-q4", prompt, temperature=0)

        frozen = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), 60)
        async with session.get(f"{gw.url}/readyz") as response:
            ready_frozen = response.status, await response.json()
    finally:
        os.kill(pid, signal.SIGCONT)
    frozen_s = time.monotonic() - started
    await asyncio.sleep(1.5)  # the guard's down_backoff_s (1 s), then a probe finds Redis again
    back = [await sdk_json(client, "small-q4", prompt, temperature=0) for _ in range(3)]
    async with session.get(f"{gw.url}/readyz") as response:
        ready_back = response.status, await response.json()
    everything = warm + frozen + back
    lines = gw.lines({request_id for _, request_id, _, _ in everything})
    statuses = [status for status, _, _, _ in everything]
    hits = [("cache hit" in text) for _, _, _, text in everything]
    row.client = (f"warm {[t for *_, t in warm]}; frozen {frozen_s:.1f} s: {sum(s == 200 for s, *_ in frozen)}/8 ok, "
                  f"{sum(hits[2:10])} hits; after: {[t for *_, t in back]}; /readyz frozen {ready_frozen[0]} "
                  f"redis={ready_frozen[1].get('redis')} limits={ready_frozen[1].get('limits')}, after "
                  f"{ready_back[0]} redis={ready_back[1].get('redis')}")
    logged = sorted({line["status"] for line in lines.values()})
    row.log = (f"{len(lines)}/{len(everything)} lines, statuses {logged}"
               f"; {len(gw.events('redis_unavailable'))} `redis_unavailable`")
    if any(status != 200 for status in statuses):
        row.findings.append(f"statuses {statuses}")
    if len(lines) != len(everything) or any(line["status"] != 200 for line in lines.values()):
        row.findings.append("log lines missing or not 200")
    if any(hits[2:10]):
        row.findings.append("a cache hit while Redis was frozen")
    if not hits[1]:
        row.findings.append("no cache hit before the freeze (warm-up)")
    if not any(hits[10:]):
        row.findings.append("no cache hit after SIGCONT")
    if ready_frozen[0] != 200 or ready_frozen[1].get("redis") != "down":
        row.findings.append(f"/readyz while frozen: {ready_frozen}")
    if ready_back[1].get("redis") != "up":
        row.findings.append(f"/readyz after SIGCONT: {ready_back}")
    if not gw.events("redis_unavailable"):
        row.findings.append("no `redis_unavailable` event")
    await serving(session, gw.url, row)
    return row


# (f) ------------------------------------------------------------------------------------------------
def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


HOSTILE: list[tuple[str, bytes, dict[str, str], str, int, str, str | None]] = [
    # (name, body, headers, FAULTS.md row, status, error code, param where the row names one)
    ("300-deep JSON in an unknown field `x` (item 6)",
     b'{"model": "small-q4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "x": ' + deep(299)
     + b"}", {"Content-Type": "application/json"}, "JSON nesting", 400, "too_deeply_nested", "x"),
    ("`Content-Encoding: gzip`, body not gzip (item 7)",
     b'{"model": "small-q4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
     {"Content-Type": "application/json", "Content-Encoding": "gzip"}, "body encoding", 400, "invalid_encoding", None),
    ("`Content-Encoding: br` (unsupported, item 7)",
     b'{"model": "small-q4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
     {"Content-Type": "application/json", "Content-Encoding": "br"}, "body encoding", 415,
     "unsupported_content_encoding", None),
    ("`Content-Type: text/plain`, JSON body (item 8)",
     b'{"model": "small-q4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
     {"Content-Type": "text/plain"}, "body type", 400, "unsupported_content_type", "Content-Type"),
    ("control: valid gzip body",
     gzip.compress(b'{"model": "small-q4", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}'),
     {"Content-Type": "application/json", "Content-Encoding": "gzip"}, "body encoding", 200, "", None),
]


async def hostile(gw: Gateway, session: aiohttp.ClientSession) -> list[Row]:
    rows = []
    for name, body, headers, where, status, code, param in HOSTILE:
        promised = f"{status}" + (f" `{code}`" + (f", param `{param}`" if param else "") if code else "")
        row = Row("f", name, f"{promised} (Limits toward clients: {where})")
        async with session.post(f"{gw.url}/v1/chat/completions", data=body, headers={**AUTH, **headers}) as response:
            got, data, request_id = response.status, await response.read(), response.headers.get("x-request-id", "")
        error: dict[str, Any] = {}
        if got != 200:
            try:
                parsed = orjson.loads(data)
                error = parsed["error"] if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) else {}
            except orjson.JSONDecodeError:
                pass
            row.client = f"{got} {error.get('type')} `{error.get('code')}` param `{error.get('param')}`: " \
                         f"{error.get('message') or data[:120]!r}"
        else:
            row.client = "200 " + str(orjson.loads(data)["choices"][0]["finish_reason"])
        line = gw.lines({request_id}).get(request_id) if request_id else None
        row.log = describe(line) if request_id else "no x-request-id"
        if got != status or (code and error.get("code") != code) or (param and error.get("param") != param):
            row.findings.append(f"got {got} `{error.get('code')}` param `{error.get('param')}`")
        if got >= 500:
            row.findings.append("a 5xx")
        if code and set(error) != {"message", "type", "param", "code"}:
            row.findings.append("error not in the OpenAI shape")
        if line is None:
            row.findings.append("no request log line")
        elif line["status"] != got:
            row.findings.append(f"log status {line['status']} != {got}")
        await serving(session, gw.url, row)
        rows.append(row)
    return rows


async def run(gw: Gateway, short: bool) -> list[Row]:
    """`short`: the cases that need a short read timeout (frozen replicas); else all the others."""
    client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-demo", max_retries=0, timeout=60)
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, gw.url, timeout_s=60.0, every_s=0.5)
        await sdk_json(client, "small-q4", "Hello.")  # the first request per replica loads its caches
        await sdk_json(client, "large-f16", "Hello.")
        if short:
            rows = [await frozen_mid_stream(gw, client, session, gw.read_timeout_s),
                    await frozen_before(gw, client, session, gw.read_timeout_s),
                    await restarted(gw, client, session)]
        else:
            rows = await hostile(gw, session)
            for case in (hang_up, redis_frozen, killed_mid_stream):
                rows.append(await case(gw, client, session))
            rows.extend(await refused(gw, client, session))
    await client.close()
    return rows


def table(rows: list[Row]) -> str:
    head = ("| # | fault (injected on the real process) | docs/FAULTS.md promises | client received "
            "| request log line | gateway after | verdict |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    cells = [[r.case, r.fault, r.promised, r.client, r.log, r.serving, r.verdict] for r in rows]
    return head + "\n".join("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"
                            for row in cells)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--read-timeout", type=float, default=3.0,
                        help="upstream.read_timeout_s of the gateway the frozen-replica cases run on (s)")
    args = parser.parse_args()
    started = time.perf_counter()
    rows: list[Row] = []
    for read_timeout_s in (args.read_timeout, None):  # frozen replicas first; then the shipped routes
        gw = Gateway(read_timeout_s, restart=read_timeout_s is not None)  # rows a, c*: a dead replica stays dead
        gw.start()
        try:
            rows += asyncio.run(asyncio.wait_for(run(gw, short=read_timeout_s is not None), RUN_BOUND_S))
        finally:
            gw.stop()
        print(f"gateway up, upstream.read_timeout_s={gw.read_timeout_s:g}: logs in {gw.work}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s in all, nproc={os.cpu_count()}; rows b, b2 on a "
          f"routes copy with upstream.read_timeout_s {args.read_timeout:g}, the others on the shipped one (120)\n")
    print(table(rows))
    return 0 if all(not row.findings for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
