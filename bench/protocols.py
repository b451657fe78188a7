"""Issue 19: the cost of the translated protocols, and embeddings per second on one core.

    .venv/bin/python bench/protocols.py [--requests 400] [--concurrency 8] [--max-tokens 64] [--inputs 4096]

Starts an emulator (profile `instant`, CPU 0, with this load generator) and `gateway serve` (CPU 1, its
embedded Redis, request log to a temp file) with a chat tier and the in-process MiniLM embedding tier, then:

1. CPU per request of the gateway process (its threads' schedstat time, Redis excluded) for streaming
   /v1/chat/completions, /v1/responses and /v1/messages asking the same prompt and `max_tokens`, in
   interleaved rounds (median of the rounds); the prompt is one the emulator answers past `max_tokens`,
   and the content events per request are counted: the comparison is at equal tokens.
2. Embeddings per second: batches of 16 new inputs (cold: encoded), the same inputs again while they are in
   the gateway's LRU (warm, in process), and a pass over twice the LRU's 4096 entries so that every input
   comes from Redis (warm, Redis).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from gateway.bench.protocol_cost import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
