"""Synthetic replayable request logs: `gateway.accounting.synth`'s week of lines with the replay fields added
(`logline`), and the routes and policy files that price and route them (the synth's tenants and tiers), for
the whatif benchmark and tests."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from hashlib import blake2b
from pathlib import Path
from typing import Any

import orjson

from gateway.accounting import synth
from gateway.whatif.logline import REPLAY_VERSION

ROUTES = """\
admission: {enabled: true, initial_limit: 64, max_queue: 256, max_wait_ms: 1000}
tiers:
""" + "".join(f"""  - name: {tier}
    precision: {tier.split('-')[1]}
    context_window: 32768
    prices: {{input_per_mtok: {p_in}, output_per_mtok: {p_out}}}
    replicas:
      - {{name: {tier}-0, url: "http://127.0.0.1:9/v1", model: m, launch: {{kind: emulator, profile: {tier.split('-')[1]}}}}}
""" for tier, (p_in, p_out) in synth.PRICES.items())

POLICY = """\
default_tier: small-int4
baseline_tier: large-fp16
max_tokens: {default: 256, maximum: 4096}
routing: {bands: [{below: 0.55, tier: small-int4}, {below: 0.85, tier: medium-int8}, {tier: large-fp16}]}
tenants:
""" + "".join(f"  - {{name: {t}, api_key_sha256: {blake2b(t.encode(), digest_size=32).hexdigest()}}}\n"
              for t in synth.TENANTS)


def replayable(line: bytes, n: int) -> bytes:
    """A synthetic request line with the replay fields (other lines as they are)."""
    try:
        obj: dict[str, Any] = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line  # the synth's malformed lines stay malformed
    if not isinstance(obj, dict) or obj.get("event") != "request" or not isinstance(obj.get("tenant"), str) \
            or "prompt_tokens" not in obj:
        return line
    conversation = n // 3  # three turns a conversation
    key = blake2b(f"{obj['tenant']}:{conversation}".encode(), digest_size=8).digest()
    turn = n % 3

    def turn_key(k: int) -> str:
        return blake2b(f"{obj['tenant']}:{conversation}:{k}".encode(), digest_size=16).hexdigest()

    obj.update({
        "path": "/v1/chat/completions", "replay": REPLAY_VERSION,
        "turn_keys": {"parent": turn_key(turn - 1) if turn else None, "current": turn_key(turn)},
        "sticky": {"conversation": int.from_bytes(key, "little"), "user": None},
        "reading": {"input_tokens": obj["prompt_tokens"], "input_chars": 4 * obj["prompt_tokens"], "outputs": 1,
                    "generated": 1, "cacheable": "deterministic" if n % 5 == 0 else "never",
                    "digest": f"{n % 997:016x}" if n % 5 == 0 else None},
        "quality_predicted": None, "decode_tps": None, "max_tokens": 4096, "max_tokens_clamped_from": None,
    })
    return orjson.dumps(obj)


def write_replayable(directory: Path, total: int, days: int = 7) -> list[Path]:
    """`total` lines over `days` rotated files (as `synth.write_logs`), replayable; the paths, oldest first."""
    paths = synth.write_logs(directory, total, days)
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            lines = _numbered(f.read().splitlines())
        with opener(path, "wb") as f:
            f.write(b"\n".join(replayable(line, n) for n, line in lines) + b"\n")
    return paths


def _numbered(lines: list[bytes]) -> Iterator[tuple[int, bytes]]:
    for line in lines:
        start = line.find(b'"req-')
        yield (int(line[start + 5:start + 13]) if start >= 0 else 0), line


def write_config(directory: Path) -> tuple[Path, Path]:
    routes, policy = directory / "routes.yaml", directory / "policy.yaml"
    routes.write_text(ROUTES)
    policy.write_text(POLICY)
    return routes, policy
