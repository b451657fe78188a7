"""Loaded by `bench/stage_cpu.py` into the gateway it starts (PYTHONPATH): times each stage of the request path,
`RequestPath.finish` (the log line and the finishers) and, where the tree has them, the log line's replay fields
and its rendering, per request, in the serving process; at exit appends one JSON object to $GATEWAY_STAGE_TIMES.
Any other process (the emulator, wrk's helpers) is left alone. Works on older trees too (a stage list of any
length), so a `git worktree` of an earlier commit is measured the same way."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from typing import Any

OUT = os.environ.get("GATEWAY_STAGE_TIMES")
if OUT and "serve" in sys.argv:
    import gateway.pipeline as pipeline

    spent: dict[str, float] = {}
    count = [0]

    def _timed_stage(cls: Any, name: str) -> None:
        call = cls.__call__

        async def timed(self: Any, ctx: Any) -> Any:
            start = time.perf_counter()
            try:
                return await call(self, ctx)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        cls.__call__ = timed

    for field in pipeline._STAGE_FIELDS:
        kind = field.type if not isinstance(field.type, str) else getattr(pipeline, field.type)
        _timed_stage(kind, field.name)
    finish = pipeline.RequestPath.finish

    def timed_finish(self: Any, ctx: Any) -> None:
        count[0] += 1
        start = time.perf_counter()
        finish(self, ctx)
        spent["finish"] = spent.get("finish", 0.0) + time.perf_counter() - start

    pipeline.RequestPath.finish = timed_finish  # type: ignore[method-assign]
    import gateway.stages.account as account

    def _timed_function(name: str) -> None:
        function = getattr(account, name, None)
        if function is None:
            return

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        setattr(account, name, timed)

    for name in ("replay_fields", "log_request"):
        _timed_function(name)

    def report(out: str = OUT) -> None:
        n = max(count[0], 1)
        with open(out, "a") as f:
            f.write(json.dumps({"requests": count[0], "us_per_request": {k: round(v / n * 1e6, 2) for k, v in spent.items()}}) + "\n")

    atexit.register(report)
