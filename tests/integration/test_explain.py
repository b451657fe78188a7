"""`POST /admin/explain` and `gateway route explain`: the decision path, with nothing sent or charged."""

import hashlib
import subprocess
import sys
from pathlib import Path

import aiohttp

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.testing import TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "sk-admin"


async def test_admin_explain_shows_limits_difficulty_tier_and_candidates(start_emulator: StartEmulator,
                                                                         start_app: StartApp) -> None:
    emulator = await start_emulator()
    base = gateway_config([tier("small", [f"{emulator.url}/v1", f"{emulator.url}/v1"]),
                           tier("large", [f"{emulator.url}/v1"])])
    data = base.policy.model_dump()
    data.update(admin_api_key_sha256=hashlib.sha256(ADMIN.encode()).hexdigest(),
                routing={"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]},
                max_tokens={"default": 16, "maximum": 32})
    config = GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))
    url = await start_app(create_app(config, TableScorer({"prove the Riemann hypothesis": 0.9})))
    request = {"model": "auto", "messages": [{"role": "user", "content": "prove the Riemann hypothesis"}],
               "max_tokens": 100}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/admin/explain", json={"tenant": "test-tenant", "request": request},
                                headers={"Authorization": f"Bearer {ADMIN}"}) as response:
            report = await response.json()
        async with session.post(f"{url}/admin/explain", json={"tenant": "nobody", "request": request},
                                headers={"Authorization": f"Bearer {ADMIN}"}) as response:
            unknown = (response.status, (await response.json())["error"]["param"])
    assert report["limits"]["max_tokens"]["asked"] == 100 and report["limits"]["max_tokens"]["applied"] == 32
    assert report["difficulty"] == 0.9 and report["tier"] == "large"
    assert [c["replica"] for c in report["candidates"]] == ["large-0"]
    assert report["decision"] == {"status": 200, "tier": "large", "replica": "large-0"}
    assert report["cache"]["status"] == "bypass"
    assert emulator.engine.stats.received == 0  # nothing was sent upstream
    assert unknown == (400, "tenant")


def test_cli_route_explain_on_the_shipped_files() -> None:
    run = [sys.executable, "-m", "gateway", "route", "explain", "--routes", str(ROOT / "routes/emulator.yaml"),
           "--policies", str(ROOT / "policies/emulator.yaml")]
    ok = subprocess.run([*run, "--tenant", "team-batch", "--prompt", "hello", "--max-tokens", "5000", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert '"applied": 1024' in ok.stdout and '"tier": "small-int4"' in ok.stdout
    refused = subprocess.run([*run, "--tenant", "demo", "--prompt", "hi", "--model", "nope"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "404" in refused.stdout and "nope" in refused.stdout


async def test_admin_explain_refuses_a_request_nested_too_deep(start_app: StartApp) -> None:
    base = gateway_config([tier("small", ["http://127.0.0.1:1/v1"])])
    data = {**base.policy.model_dump(), "admin_api_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()}
    url = await start_app(create_app(GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))))
    deep = b"[" * 300 + b"]" * 300  # orjson writes at most 254 levels
    body = b'{"tenant": "test-tenant", "request": {"model": "auto", "messages": [], "x": ' + deep + b"}}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/admin/explain", data=body, headers={
                "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}) as response:
            status, error = response.status, (await response.json(content_type=None))["error"]
    assert (status, error["param"]) == (400, "request") and "64 levels" in error["message"]
