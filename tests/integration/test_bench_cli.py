"""`gateway bench` as a process against a real emulator on loopback, for a couple of seconds."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from gateway.bench.arrivals import Arrivals, offsets_within
from tests.conftest import StartEmulator


async def _bench(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "bench", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode()


async def test_open_loop_sweep_writes_json_table_and_plot(start_emulator: StartEmulator, tmp_path: Path) -> None:
    emu = await start_emulator("int4")
    result, plot = tmp_path / "r.json", tmp_path / "p.png"
    rc, out = await _bench("--base-url", emu.url + "/v1", "--model", "m", "--dataset", "synthetic",
                           "--input-len", "32", "--output-len", "8", "--request-rate", "10", "20",
                           "--duration", "1.5", "--goodput", "ttft:500", "tpot:50", "--result-file", str(result),
                           "--plot", str(plot), "--no-progress")
    assert rc == 0, out
    assert "poisson 10 req/s" in out and "Request goodput (req/s):" in out and "P99 ITL (ms):" in out
    data = json.loads(result.read_text())
    assert data["goodput_slo_ms"] == {"ttft": 500.0, "tpot": 50.0}
    assert [r["request_rate"] for r in data["runs"]] == [10.0, 20.0]
    for run, rate in zip(data["runs"], (10, 20)):
        sent = len(offsets_within(Arrivals("poisson", rate), 1.5))  # the same seed (0) as the CLI's
        assert run["failed"] == 0 and run["completed"] == len(run["ttfts"]) == sent
        assert set(run["output_lens"]) == {8} and run["total_output_tokens"] == 8 * run["completed"]
        # the int4 profile: ~8 ms to first token, a decode step of >= 6.5 ms
        assert 1 < run["median_ttft_ms"] < 500 and 5 < run["mean_tpot_ms"] < 100
        assert run["request_goodput"] <= run["request_throughput"] and run["request_goodput"] > 0
        assert max(run["start_times"]) < 1.5
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_closed_loop_sharegpt_conversations(start_emulator: StartEmulator, tmp_path: Path) -> None:
    emu = await start_emulator("instant")
    result = tmp_path / "r.json"
    rc, out = await _bench("--base-url", emu.url + "/v1", "--model", "m", "--num-prompts", "12", "--max-turns", "3",
                           "--concurrency", "4", "--result-file", str(result), "--no-progress")
    assert rc == 0, out
    (run,) = json.loads(result.read_text())["runs"]
    assert run["arrivals"] == "closed" and run["concurrency"] == 4
    assert run["completed"] == 12 and run["failed"] == 0
    assert run["total_output_tokens"] == sum(run["output_lens"]) and min(run["input_lens"]) >= 4


async def test_bad_goodput_is_refused(tmp_path: Path) -> None:
    rc, out = await _bench("--goodput", "latency:5")
    assert rc == 2 and "goodput SLO" in out
