"""deploy/docker-compose.yaml and the Dockerfiles without Docker: the compose file parses, every file
it and the Dockerfiles reference exists, each profile's routes and policy load together, and the
routes point at the compose services with the model names those servers serve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import load_config
from gateway.config.loader import load_routes

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# profile -> (GATEWAY_TIERS, GATEWAY_POLICY, the repository routes file the compose one mirrors)
PROFILES = {"gpu": ("vllm", "example", "production-vllm.yaml"), "cpu": ("cpu", "local", "local.yaml")}
MODEL_FLAGS = ("--served-model-name", "--model_alias")


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def substitute(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR:-default} interpolation."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text)


def host_path(container_path: str) -> Path:
    """The host file behind `container_path`, through the service's bind mounts."""
    for volume in compose()["services"]["gateway-a"]["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith(".") and container_path.startswith(target + "/"):
            return (DEPLOY / str(source) / container_path[len(target) + 1:]).resolve()
    raise AssertionError(f"{container_path} is on no bind mount")


def test_compose_builds_and_mounts_files_that_exist() -> None:
    services = compose()["services"]
    for name, service in services.items():
        build = service.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"
    assert {"redis", "gateway-a", "gateway-b"} <= {n for n, s in services.items() if "profiles" not in s}


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_serves_valid_routes_to_its_own_servers(profile: str) -> None:
    tiers_name, policy_name, mirrored = PROFILES[profile]
    env = {"GATEWAY_TIERS": tiers_name, "GATEWAY_POLICY": policy_name}
    services = compose()["services"]
    command = [substitute(part, env) for part in services["gateway-a"]["command"]]
    routes = host_path(command[command.index("--routes") + 1])
    policy = host_path(command[command.index("--policies") + 1])
    config = load_config(routes, policy)  # both files valid, and the policy's tiers exist in the routes
    servers = {n: s for n, s in services.items() if profile in s.get("profiles", [])}
    for tier in config.tiers.values():
        for replica in tier.replicas:
            server = servers[urlsplit(replica.url).hostname or ""]
            args = server["command"]
            assert replica.model in {args[args.index(f) + 1] for f in MODEL_FLAGS if f in args}
            assert str(urlsplit(replica.url).port) == args[args.index("--port") + 1]
            if profile == "gpu":
                assert "--enable-prefix-caching" in args
                assert server["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    mirror = load_routes(ROOT / "routes" / mirrored)
    same = ("name", "precision", "context_window", "prices", "tokenizer", "quality_model")
    assert [t.model_dump(include=set(same)) for t in config.routes.tiers] == [
        t.model_dump(include=set(same)) for t in mirror.tiers]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_what_exists_and_run_as_non_root(dockerfile: str) -> None:
    text = (DEPLOY / dockerfile).read_text()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M):
        *sources, _ = line.split()
        assert all((ROOT / source).exists() for source in sources), line
    assert re.search(r"^USER 10001$", text, flags=re.M) and "HEALTHCHECK" in text
    defaults = re.search(r'"--routes", "/etc/gateway/(\S+)",.*"--policies", "/etc/gateway/(\S+)"', text, flags=re.S)
    assert defaults is not None
    assert all((ROOT / path).is_file() for path in defaults.groups())
    assert (DEPLOY / f"{dockerfile}.dockerignore").is_file()
