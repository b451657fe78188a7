"""aiperf (NVIDIA's LLM load generator) for bench/aiperf_compare.py: its own virtual environment (.venv-aiperf,
git-ignored), created on first use from bench/aiperf_env/requirements.txt; the Gemma tokenizer folder it counts
tokens with (converted from the GGUF by bench/aiperf_env/gguf_tokenizer.py, cached under ~/.cache/gateway); and
its command line.

aiperf is never a dependency of the gateway: nothing under gateway/ imports it (it runs as a separate process
from its own venv). Nothing is downloaded at run time: PyPI at setup only, and aiperf is run with the hub off
for everything but the local tokenizer path (see `environment`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.report import ROOT

HERE = ROOT / "bench" / "aiperf_env"  # requirements.txt and gguf_tokenizer.py
VENV = ROOT / ".venv-aiperf"
REQUIREMENTS = HERE / "requirements.txt"
STAMP = VENV / ".installed"  # holds the requirements it was installed from
CONVERTER = HERE / "gguf_tokenizer.py"
TOKENIZER = Path.home() / ".cache" / "gateway" / "tokenizers" / "gemma-3-270m"


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(base_python: str = "python3.11") -> Path:
    """The aiperf executable; creates or updates the venv when the requirements changed (PyPI only)."""
    wanted = REQUIREMENTS.read_text()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return VENV / "bin" / "aiperf"
    print(f"setting up {VENV.name} from {REQUIREMENTS.relative_to(ROOT)} (first run: a minute or two)", flush=True)
    if not python().exists():
        subprocess.run([base_python if _has(base_python) else sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python()), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    STAMP.write_text(wanted)
    return VENV / "bin" / "aiperf"


def _has(executable: str) -> bool:
    try:
        return subprocess.run([executable, "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


def version() -> str:
    code = ("import importlib.metadata as m; "
            "print(f\"aiperf {m.version('aiperf')}, transformers {m.version('transformers')}\")")
    out = subprocess.run([str(python()), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def environment() -> dict[str, str]:
    """aiperf's environment: HF_HUB_OFFLINE unset (with it set, aiperf 0.13 refuses a local tokenizer path as
    "not cached"), and no token, telemetry or progress bars; the tokenizer is a local folder, so no hub call
    is made either way."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    env.update({"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
                "NO_COLOR": "1", "COLUMNS": "160"})
    return env


def tokenizer(check_url: str | None = None) -> dict[str, object]:
    """The Gemma tokenizer folder (converted once, cached); with `check_url` (a llama-server of the same GGUF),
    its ids compared with the server's /tokenize. The converter's report: folder, compared, matched, differ."""
    argv = [str(python()), str(CONVERTER), "--out", str(TOKENIZER)] + (["--check-url", check_url] if check_url else [])
    out = subprocess.run(argv, capture_output=True, text=True, env=environment())
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"tokenizer conversion failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    report: dict[str, object] = json.loads(lines[-1])
    if out.returncode != 0:
        raise RuntimeError(f"the converted tokenizer disagrees with llama-server: {json.dumps(report)[:3000]}")
    return report


@dataclass(frozen=True, slots=True)
class Load:
    """One aiperf profile: synthetic prompts of `isl` tokens (no spread), `osl` output tokens asked with
    `ignore_eos`, streamed, `concurrency` requests in flight until `requests` were sent."""

    isl: int
    osl: int
    concurrency: int
    requests: int
    seed: int = 41


def argv(executable: Path, base_url: str, model: str, api_key: str, load: Load, artifacts: Path,
         extra: Sequence[str] = ()) -> list[str]:
    """`aiperf profile` against an OpenAI-compatible `base_url` (no /v1): chat, streaming, the tokenizer folder;
    per-request records with the HTTP trace (the gateway's x-request-id header joins them to its log lines);
    no GPU telemetry and no scrape of the gateway's /metrics by aiperf (the bench scrapes it itself)."""
    return [str(executable), "profile", "--model", model, "--tokenizer", str(TOKENIZER), "--url", base_url,
            "--endpoint-type", "chat", "--streaming", "--api-key", api_key,
            "--synthetic-input-tokens-mean", str(load.isl), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(load.osl), "--extra-inputs", "ignore_eos:true",
            "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
            "--random-seed", str(load.seed), "--artifact-dir", str(artifacts), "--export-http-trace",
            "--no-gpu-telemetry", "--no-server-metrics", "--ui", "none", *extra]
