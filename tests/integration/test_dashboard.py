"""GET /dashboard in a real browser (headless Chromium) against a gateway under emulator traffic:
the panels hold data, a screenshot is written. No browser is a failure, not a skip, unless
GATEWAY_SKIP_BROWSER=1 says so (for a laptop without Chromium; CI installs it, see .ci/run)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import Tier
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

VIEWER_KEY = "sk-viewer"
ADMIN_KEY = "sk-admin"
BANDS = {"bands": [{"below": 0.5, "tier": "small-int4"}, {"tier": "large-fp16"}]}
PROMPTS = {"say hi": 0.1, "prove the theorem": 0.9, "list three colours": 0.3}
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars")


def browser() -> str:
    """Chromium's path; fails loudly when there is none (skips only when GATEWAY_SKIP_BROWSER=1)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    if os.environ.get("GATEWAY_SKIP_BROWSER") == "1":
        pytest.skip("no Chromium, and GATEWAY_SKIP_BROWSER=1")
    pytest.fail("no Chromium found on PATH: `apt-get install -y chromium` (.ci/run does), "
                "or set GATEWAY_SKIP_BROWSER=1 to skip this test locally")


async def run_chromium(chromium: str, profile: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, f"chromium failed ({process.returncode}): {err.decode()[-2000:]}"
    return out.decode()


async def traffic(url: str, requests: int) -> None:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as session:
        async def one(i: int) -> None:
            prompt = list(PROMPTS)[i % len(PROMPTS)]
            body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                    "stream": True}
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()
        await asyncio.gather(*(one(i) for i in range(requests)))


EMBEDDER = Tier.model_validate({"name": "all-minilm-l6-v2", "precision": "fp32", "context_window": 256,
                                "prices": {"input_per_mtok": 0.005, "output_per_mtok": 0},
                                "embedder": {"kind": "minilm"}})
IDLE = "idle-int8"  # a tier nothing is routed to


async def start(start_emulator: StartEmulator, start_app: StartApp, slo_ms: float | None = 2000) -> str:
    tiers = [tier("small-int4", [f"{(await start_emulator('int4')).url}/v1"]),
             tier("large-fp16", [f"{(await start_emulator('fp16')).url}/v1"], precision="fp16", output_per_mtok=8.0),
             tier(IDLE, ["http://127.0.0.1:9/v1"], precision="int8"), EMBEDDER]
    sha = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    slo = {} if slo_ms is None else {"ttft_slo_ms": slo_ms}
    config = gateway_config(tiers, policy={"routing": BANDS, **slo, "admin_api_key_sha256": sha(ADMIN_KEY),
                                           "dashboard_viewer_keys_sha256": [sha(VIEWER_KEY)]})
    return await start_app(create_app(config, TableScorer(PROMPTS)))


async def embeddings(url: str, requests: int) -> None:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as session:
        for i in range(requests):
            body = {"model": EMBEDDER.name, "input": f"embed sentence {i}"}
            async with session.post(f"{url}/v1/embeddings", json=body) as response:
                assert response.status == 200, await response.text()


def cells(dom: str, table: str) -> list[dict[str, str]]:
    """The rows of the table with id `table`, each as {data-field: text}."""
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert body, f"no table {table}"
    return [dict(re.findall(r'<td data-field="([^"]+)">([^<]*)</td>', row))
            for row in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)]


async def test_the_dashboard_needs_a_viewer_or_admin_key(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await start(start_emulator, start_app)
    async with aiohttp.ClientSession() as session:
        for key, status in ((None, 401), (TEST_API_KEY, 401), (VIEWER_KEY, 200), (ADMIN_KEY, 200)):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with session.get(f"{url}/dashboard/data.json", headers=headers) as response:
                assert response.status == status, key
            async with session.get(f"{url}/dashboard", headers=headers) as response:
                assert response.status == status, key


async def test_a_browser_logs_in_by_post_and_holds_an_opaque_session(start_emulator: StartEmulator,
                                                                     start_app: StartApp) -> None:
    """Issue 37: the cookie held the raw key and the login put it in the URL. The key now goes in a POST body;
    the cookie holds a random token the gateway maps to a session (expiring, ended by logout)."""
    url = await start(start_emulator, start_app)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.get(f"{url}/dashboard", params={"key": VIEWER_KEY}, allow_redirects=False) as response:
            assert response.status == 401 and "Set-Cookie" not in response.headers  # a key in the URL: refused
            assert 'method="post"' in await response.text()
        async with session.post(f"{url}/dashboard/login", data={"key": "sk-wrong"}, allow_redirects=False) as response:
            assert response.status == 401 and "Set-Cookie" not in response.headers
        tokens = []
        for _ in range(2):
            async with session.post(f"{url}/dashboard/login", data={"key": VIEWER_KEY},
                                    allow_redirects=False) as response:
                assert response.status == 303 and response.headers["Location"] == "/dashboard"
                cookie = response.cookies["gateway_dashboard"]
                assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/dashboard"
                tokens.append(cookie.value)
        assert tokens[0] != tokens[1] and all(len(t) >= 40 and VIEWER_KEY not in t for t in tokens)
        async with session.get(f"{url}/dashboard/data.json") as response:
            assert response.status == 200  # the jar sends the last session
        for cookie_value, status in ((tokens[0], 200), (VIEWER_KEY, 401), ("forged-token", 401)):
            async with aiohttp.ClientSession() as bare:
                async with bare.get(f"{url}/dashboard/data.json",
                                    headers={"Cookie": f"gateway_dashboard={cookie_value}"}) as response:
                    assert response.status == status, cookie_value  # the raw key as a cookie is not a session
        async with session.post(f"{url}/dashboard/logout", allow_redirects=False) as response:
            assert response.status == 303
        async with aiohttp.ClientSession() as bare:
            async with bare.get(f"{url}/dashboard/data.json",
                                headers={"Cookie": f"gateway_dashboard={tokens[1]}"}) as response:
                assert response.status == 401  # logged out: the token is gone on the server


async def login_page(gateway_url: str, key: str) -> tuple[str, web.AppRunner]:
    """A page on another port of the same host (same site) that logs the browser in by POST, as a person would
    with the login form: the key never appears in an address."""
    html = (f'<!doctype html><form id="f" method="post" action="{gateway_url}/dashboard/login">'
            f'<input name="key" value="{key}"></form><script>document.getElementById("f").submit()</script>')

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return f"http://127.0.0.1:{port}/", runner


async def test_the_page_shows_live_data_in_a_real_browser(start_emulator: StartEmulator, start_app: StartApp,
                                                          tmp_path: Path) -> None:
    chromium = browser()
    url = await start(start_emulator, start_app)
    await traffic(url, 60)
    await embeddings(url, 4)
    page, runner = await login_page(url, VIEWER_KEY)
    try:
        dom = await run_chromium(chromium, tmp_path / "profile-dom", "--virtual-time-budget=8000", "--dump-dom", page)
        assert VIEWER_KEY not in dom
        rows = dict(re.findall(r'<td data-field="tier">([^<]+)</td><td data-field="requests">(\d+)</td>', dom))
        assert set(rows) == {"small-int4", "large-fp16", EMBEDDER.name}, dom[-3000:]
        assert rows == {"small-int4": "40", "large-fp16": "20", EMBEDDER.name: "4"}, rows
        ttfts = re.findall(r'<td data-field="ttft_p50_ms">([0-9.]+)</td>', dom)
        assert len(ttfts) == 3 and all(float(ms) > 0 for ms in ttfts)
        assert dom.count('class="uplot') >= 6, "uPlot did not draw the charts"  # the vendored library ran
        assert re.search(r'<td data-field="tenant">test-tenant</td><td data-field="requests">64</td>', dom)
        shares = {row["tier"]: row["share"] for row in cells(dom, "shares")}  # the routing table: every tier, a share
        # 60 chats cycle over PROMPTS: "say hi" (0.1) and "list three colours" (0.3) go to small, "prove the
        # theorem" (0.9) to large; and 4 embeddings: 40, 20 and 4 of 64 (each tier's own share, not itself)
        assert shares == {"small-int4": "62.5 %", "large-fp16": "31.3 %", IDLE: "0.0 %", EMBEDDER.name: "6.3 %"}, shares
        replicas = {row["replica"]: row for row in cells(dom, "replicas")}
        assert set(replicas) == {"small-int4-0", "large-fp16-0", f"{IDLE}-0"}, replicas
        for name in ("small-int4-0", "large-fp16-0"):
            row = replicas[name]
            assert (row["health"], row["in_flight"], row["awaiting_first_token"]) == ("up", "0", "0"), row
            assert int(row["sent"]) > 0 and float(row["measured_ttft_ms"]) > 0 and float(row["predicted_ttft_ms"]) > 0
        assert (replicas[f"{IDLE}-0"]["sent"], replicas[f"{IDLE}-0"]["measured_ttft_ms"]) == ("0", "-")
        assert re.search(r'id="goodput-now">[0-9.]+ %<', dom)
        assert 'id="redis">off<' in dom and 'id="error"></span>' in dom
        shot = tmp_path / "dashboard.png"
        await run_chromium(chromium, tmp_path / "profile-shot", "--virtual-time-budget=8000", "--window-size=1400,1600",
                           f"--screenshot={shot}", page)
        assert shot.stat().st_size > 20_000
        if target := os.environ.get("GATEWAY_DASHBOARD_SCREENSHOT"):  # refresh docs/dashboard.png by hand
            shutil.copy(shot, target)
    finally:
        await runner.cleanup()


async def test_goodput_says_no_slo_when_the_policy_sets_none(start_emulator: StartEmulator, start_app: StartApp,
                                                             tmp_path: Path) -> None:
    """Without a TTFT SLO every served request would count as good: 100 % said nothing."""
    chromium = browser()
    url = await start(start_emulator, start_app, slo_ms=None)
    await traffic(url, 6)
    page, runner = await login_page(url, VIEWER_KEY)
    try:
        dom = await run_chromium(chromium, tmp_path / "profile", "--virtual-time-budget=8000", "--dump-dom", page)
    finally:
        await runner.cleanup()
    assert 'id="goodput-now">no SLO<' in dom
    assert {row["goodput"] for row in cells(dom, "tiers")} == {"no SLO"}


@pytest.mark.parametrize("name", ["local", "emulator"])
def test_make_run_prints_the_dashboard_address_with_the_demo_viewer_key(name: str) -> None:
    from gateway.config import load_config
    from gateway.local.up import dashboard_url

    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "routes" / f"{name}.yaml", root / "policies" / f"{name}.yaml")
    assert dashboard_url(config, "127.0.0.1", 8080) == "http://127.0.0.1:8080/dashboard (log in with sk-dashboard)"
