"""The demo keys of the shipped policies work as the README says: /admin/config with sk-admin."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import StartApp

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["local", "emulator"])
async def test_the_demo_admin_key_opens_admin_config(start_app: StartApp, name: str) -> None:
    routes, policy = ROOT / "routes" / f"{name}.yaml", ROOT / "policies" / f"{name}.yaml"
    url = await start_app(create_app(load_config(routes, policy), config_files=(routes, policy)))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/admin/config", headers={"Authorization": "Bearer sk-admin"}) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["last_error"] is None
        async with session.get(f"{url}/admin/config", headers={"Authorization": "Bearer sk-demo"}) as response:
            assert response.status == 401  # a tenant's key is not the admin key
    readme = (ROOT / "README.md").read_text()
    assert "/admin/config -H 'Authorization: Bearer sk-admin'" in readme
