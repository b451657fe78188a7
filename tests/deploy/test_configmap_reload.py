"""Hot reload from Kubernetes ConfigMap volumes: kubelet publishes a new version by writing a fresh
timestamped folder and renaming a `..data_tmp` symlink over `..data`; each file name is a symlink
into `..data`. The watcher must notice that swap (no event names the file itself)."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.config import GatewayConfig
from gateway.config.reload import ConfigReloader
from gateway.testing import TEST_API_KEY, routes_yaml

KEY_HASH = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()


def policy(default_max_tokens: object) -> str:
    return f"default_tier: t\nmax_tokens: {{default: {default_max_tokens}, maximum: 64}}\n" \
           f"tenants: [{{name: team, api_key_sha256: {KEY_HASH}}}]\n"


def publish(folder: Path, files: Mapping[str, str], version: int) -> None:
    """What kubelet's atomic writer does for a ConfigMap volume."""
    folder.mkdir(exist_ok=True)
    stamp = folder / f"..2026_01_01_00_00_{version:02d}.000000001"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    old = (folder / "..data").resolve() if (folder / "..data").exists() else None
    (folder / "..data_tmp").symlink_to(stamp.name)
    (folder / "..data_tmp").rename(folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(old)


def default_max_tokens(config: GatewayConfig) -> int | None:
    return config.policy.max_tokens.default if config.policy.max_tokens else None


async def until(check: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the watcher did not react in time"
        await asyncio.sleep(0.05)


async def test_a_configmap_symlink_swap_is_reloaded(tmp_path: Path) -> None:
    routes_dir, policies_dir = tmp_path / "routes", tmp_path / "policies"
    publish(routes_dir, {"routes.yaml": routes_yaml("http://127.0.0.1:9/v1")}, 1)
    publish(policies_dir, {"policy.yaml": policy(4)}, 1)
    applied: list[GatewayConfig] = []
    reloader = ConfigReloader(routes_dir / "routes.yaml", policies_dir / "policy.yaml", apply=applied.append)
    assert reloader.state.files == (routes_dir / "routes.yaml", policies_dir / "policy.yaml")  # not resolved
    stop = asyncio.Event()
    watcher = asyncio.create_task(reloader.watch(stop))
    try:
        await asyncio.sleep(0.5)  # the watcher's start
        publish(policies_dir, {"policy.yaml": policy(7)}, 2)
        await until(lambda: applied and default_max_tokens(applied[-1]) == 7)

        publish(policies_dir, {"policy.yaml": policy("lots")}, 3)  # refused: the last good one stays
        await until(lambda: reloader.state.last_error)
        assert "policy.yaml" in str(reloader.state.last_error[0]) and len(applied) == 1

        publish(routes_dir, {"routes.yaml": routes_yaml("http://127.0.0.1:9/v1", tier_name="u")}, 2)
        publish(policies_dir, {"policy.yaml": policy(9).replace("default_tier: t", "default_tier: u")}, 4)
        await until(lambda: default_max_tokens(applied[-1]) == 9 and "u" in applied[-1].tiers)
    finally:
        stop.set()
        await watcher
