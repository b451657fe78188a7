"""wrk as the closed-loop load generator (gateway.bench.closed_loop): its script and command line, the
parser of its output (captured from wrk 4.1.0), and one real 1 s run against a tiny aiohttp server."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from gateway.bench.closed_loop import (
    MARK,
    LoadSpec,
    Measurement,
    WrkResult,
    lua_string,
    parse_output,
    wrk_argv,
    wrk_script,
)

# wrk debian/4.1.0-3+b2, `-t 1 -c 4 -d 1s --timeout 10s -s <wrk_script>` against aiohttp on loopback
CAPTURED_OK = """\
Running 1s test @ http://127.0.0.1:56481/v1/chat/completions
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   476.80us    1.44ms  18.10ms   97.21%
    Req/Sec    14.65k     1.45k   16.07k    90.00%
  14718 requests in 1.02s, 2.40MB read
Requests/sec:  14480.76
Transfer/sec:      2.36MB
wrk-result {"requests":14718,"duration_us":1016383,"bytes":2516778,"connect":0,"read":0,"write":0,"status":0,\
"timeout":0,"p50_us":242,"p90_us":339,"p99_us":7785,"max_us":18100,"mean_us":476.8}
"""
# the same, every answer a 400
CAPTURED_400 = """\
Running 1s test @ http://127.0.0.1:35451/v1/chat/completions
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   234.02us  161.11us   4.31ms   98.32%
    Req/Sec    17.80k     0.95k   19.30k    63.64%
  19457 requests in 1.10s, 2.23MB read
  Non-2xx or 3xx responses: 19457
Requests/sec:  17686.48
Transfer/sec:      2.02MB
wrk-result {"requests":19457,"duration_us":1100106,"bytes":2334840,"connect":0,"read":0,"write":0,"status":19457,\
"timeout":0,"p50_us":213,"p90_us":265,"p99_us":524,"max_us":4313,"mean_us":234.0}
"""
BODY = b'{"model":"m","messages":[{"role":"user","content":"say \\"hi\\"\\\\n"}],"stream":true}'
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-x"}


def test_parse_output_reads_the_result_line() -> None:
    r = parse_output(CAPTURED_OK)
    assert (r.requests, r.bytes, r.ok, r.failed) == (14718, 2516778, 14718, 0)
    assert r.duration_s == pytest.approx(1.016383)
    assert (r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms, r.mean_ms) == pytest.approx((0.242, 0.339, 7.785, 18.1, 0.4768))
    assert r.rps == pytest.approx(14718 / 1.016383)


def test_non_2xx_answers_are_not_successes() -> None:
    r = parse_output(CAPTURED_400)
    assert r.requests == 19457 and r.errors["status"] == 19457 and r.ok == 0 and r.rps == 0.0
    assert r.failed == 19457


def test_parse_output_without_the_result_line_says_what_wrk_printed() -> None:
    text = "unable to connect to 127.0.0.1:1 Connection refused\n"
    with pytest.raises(ValueError, match="Connection refused"):
        parse_output(text)


def test_lua_string_escapes() -> None:
    assert lua_string('a "b" \\ c\nd') == '"a \\"b\\" \\\\ c\\nd"'


def test_script_posts_the_body_and_headers_and_prints_the_result_line() -> None:
    script = wrk_script(BODY, HEADERS)
    assert 'wrk.method = "POST"' in script
    assert f"wrk.body = {lua_string(BODY.decode())}" in script
    assert 'wrk.headers["Authorization"] = "Bearer sk-x"' in script
    assert "done = function(summary, latency, requests)" in script and f'"{MARK}"' in script


def test_command_line() -> None:
    spec = LoadSpec("http://127.0.0.1:9/v1/chat/completions", BODY, HEADERS, concurrency=32, duration_s=10)
    assert wrk_argv("/usr/bin/wrk", spec, Path("/tmp/s.lua")) == [
        "/usr/bin/wrk", "-t", "1", "-c", "32", "-d", "10s", "--timeout", "10s", "-s", "/tmp/s.lua",
        "http://127.0.0.1:9/v1/chat/completions"]
    with pytest.raises(ValueError):
        wrk_argv("wrk", LoadSpec("http://x/", b"{}", concurrency=1, threads=2), Path("s.lua"))


def test_measurement_per_core_and_busy_cores() -> None:
    run = WrkResult(1000, 10.0, 0, {"connect": 0, "read": 0, "write": 0, "status": 10, "timeout": 0},
                    1.0, 2.0, 3.0, 4.0, 1.5)
    m = Measurement("gateway", "chat", run, proxy_cpu_s=5.0, emulator_cpu_s=3.0, loadgen_cpu_s=1.0, other_cores=0.0)
    assert m.per_core == pytest.approx(990 / 5.0) and m.proxy_busy == 0.5 and m.load_busy == 0.4
    assert m.row()["per_core"] == m.per_core and m.row()["run"]["requests"] == 1000


async def test_wrk_really_runs_against_a_server(start_app: Callable[[web.Application], Awaitable[str]],
                                                tmp_path: Path) -> None:
    """One second of wrk against an aiohttp server answering a chunked SSE stream (as the proxies do)."""
    exe = shutil.which("wrk")
    if exe is None:
        pytest.fail("wrk is not installed: `make loadgen` (apt-get install -y wrk); CI installs it")
    seen: list[bool] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(body == BODY and request.headers.get("Authorization") == "Bearer sk-x")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"):
            await resp.write(event)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    base = await start_app(app)
    spec = LoadSpec(f"{base}/v1/chat/completions", BODY, HEADERS, concurrency=4, duration_s=1)
    script = tmp_path / "s.lua"
    script.write_text(wrk_script(spec.body, spec.headers))
    proc = await asyncio.create_subprocess_exec(*wrk_argv(exe, spec, script), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()
    r = parse_output(out.decode())
    assert r.ok > 50 and r.failed == 0, out.decode()
    assert all(seen) and len(seen) >= r.requests
    assert 0 < r.p50_ms <= r.p99_ms <= r.max_ms and 0.9 < r.duration_s < 3
