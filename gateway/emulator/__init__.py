"""OpenAI-compatible backend emulator with prefill/decode physics (tests, benchmarks, what-if).

    app = create_emulator_app(PROFILES["fp16"], seed=1)       # aiohttp app, engine at app[ENGINE_KEY]
    await run_emulator("127.0.0.1", 8001, "int4", seed=0)      # what `gateway emulate` runs
    async with serve_emulator(PROFILES["instant"]) as emu: ... # tests: loopback, port 0
"""

from .engine import Engine, RequestError
from .faults import FaultConfig
from .harness import RunningEmulator, serve_emulator
from .profiles import PROFILES, Profile, get_profile
from .server import ENGINE_KEY, create_emulator_app, run_emulator

__all__ = [
    "ENGINE_KEY", "PROFILES", "Engine", "FaultConfig", "Profile", "RequestError",
    "RunningEmulator", "create_emulator_app", "get_profile", "run_emulator", "serve_emulator",
]
