"""CPU per request of the upstream client alone (gateway/backends/h1.py) against another version of it.

    .venv/bin/python bench/h1_client_cost.py --baseline OLD_H1.py [--requests 3000] [--reps 5]

A replica in a child process (a raw asyncio server on loopback answering every POST with a fixed JSON
answer, or a chunked stream of 16 SSE events) and, in this process, the client sending requests one after
another over one kept-alive connection; the CPU time of this process per request, for this tree's h1.py and
for `--baseline` (e.g. `git show eb437bc:gateway/backends/h1.py > /tmp/h1_before.py`), alternating, on
uvloop. The median and the minimum of `--reps` per version, and their ratios, are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import uvloop

ROOT = Path(__file__).resolve().parents[1]
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"token"}}]}\n\n'
STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
          + b"".join(b"%x\r\n%s\r\n" % (len(EVENT), EVENT) for _ in range(16)) + b"0\r\n\r\n")
JSON_BODY = b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}]}'
JSON_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(JSON_BODY), JSON_BODY))

SERVER = """
import asyncio, sys
answer = {answer!r}
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\\r\\n")[0]))
            writer.write(answer)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def cpu_per_request(h1: ModuleType, url: str, requests: int, streamed: bool) -> float:
    client = h1.UpstreamClient()
    headers = "Content-Type: application/json\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'
    try:
        for _ in range(50):  # warm: the connection, the origin, the code paths
            await (await client.post(url, "/chat/completions", body, headers, connect_s=5, read_s=5)).read()
        started = time.process_time()
        for _ in range(requests):
            response = await client.post(url, "/chat/completions", body, headers, connect_s=5, read_s=5)
            if streamed:
                while await response.readany():
                    pass
                response.release()
            else:
                await response.read()
        return (time.process_time() - started) / requests * 1e6
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="another h1.py to compare with")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    versions = {"baseline": load(args.baseline, "h1_baseline"), "this tree": load(ROOT / "gateway/backends/h1.py",
                                                                                  "h1_this_tree")}
    for kind, answer in (("JSON answer", JSON_ANSWER), ("SSE stream, 16 events", STREAM)):
        server = subprocess.Popen([sys.executable, "-c", SERVER.format(answer=answer)], stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
            samples: dict[str, list[float]] = {name: [] for name in versions}
            for _ in range(args.reps):
                for name, module in versions.items():
                    samples[name].append(uvloop.run(cpu_per_request(module, url, args.requests, answer is STREAM)))
        finally:
            server.kill()
            server.wait()
        medians = {name: statistics.median(values) for name, values in samples.items()}
        for name, values in samples.items():
            print(f"{kind:24s} {name:10s} median {medians[name]:6.1f}, min {min(values):6.1f} us/request  "
                  f"(runs: {', '.join(f'{v:.1f}' for v in values)})")
        print(f"{kind:24s} ratio this tree / baseline: {medians['this tree'] / medians['baseline']:.3f} (medians), "
              f"{min(samples['this tree']) / min(samples['baseline']):.3f} (minima)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
