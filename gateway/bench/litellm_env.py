"""LiteLLM for bench/compare.py: its own virtual environment (.venv-litellm, git-ignored), created on
first use from bench/litellm/requirements.txt, and the proxy's config and command line.

LiteLLM is never a dependency of the gateway: nothing under gateway/ imports it (this module runs it
as a separate process from its own venv).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.bench.procs import Procs, free_port, wait_http
from gateway.bench.report import ROOT

HERE = ROOT / "bench" / "litellm"  # requirements.txt and config.yaml
VENV = ROOT / ".venv-litellm"
REQUIREMENTS = HERE / "requirements.txt"
STAMP = VENV / ".installed"  # holds the requirements it was installed from


def ensure_venv(python: str = "python3.11") -> Path:
    """The LiteLLM executable; creates or updates the venv when the requirements changed."""
    wanted = REQUIREMENTS.read_text()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return VENV / "bin" / "litellm"
    print(f"setting up {VENV.name} from {REQUIREMENTS.relative_to(ROOT)} (first run: a few minutes)", flush=True)
    if not (VENV / "bin" / "python").exists():
        subprocess.run([python if _has(python) else sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    STAMP.write_text(wanted)
    return VENV / "bin" / "litellm"


def _has(python: str) -> bool:
    try:
        return subprocess.run([python, "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


def version() -> str:
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def write_config(path: Path, small_url: str, large_url: str) -> Path:
    """bench/litellm/config.yaml with the two tiers' base URLs (…/v1) filled in."""
    text = (HERE / "config.yaml").read_text().replace("{small_url}", small_url).replace("{large_url}", large_url)
    path.write_text(text)
    return path


def argv(executable: Path, config: Path, port: int) -> list[str]:
    """One LiteLLM proxy process (one uvicorn worker) on 127.0.0.1:port."""
    return [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]


def start(procs: Procs, folder: Path, upstream: str, cpus: set[int] | None) -> tuple[int, int]:
    """The LiteLLM proxy (venv set up on first use) on a free port, both tiers at `upstream` (…/v1), on
    `cpus`, config and log in `folder`; waits until it answers. (port, pid)."""
    exe = ensure_venv()
    config = write_config(folder / "litellm.yaml", upstream, upstream)
    port = free_port()
    os.environ["LITELLM_LOG"] = "ERROR"
    proc = procs.start("litellm", argv(exe, config, port), cpus, folder / "litellm.log")
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, "litellm", timeout_s=120)
    return port, proc.pid
