"""Hot reload: watch the routes and policy files (and SIGHUP); a new version replaces the serving one
only after it validated completely. A bad file is refused with file, line, field and reason, and the
last good version keeps serving. In-flight requests keep the version they started with."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import watchfiles

from gateway.config import ConfigError, ConfigIssue, GatewayConfig, load_config

log = structlog.get_logger("gateway.config")
CONFIGMAP_DATA = "..data"  # the symlink kubelet swaps atomically when a mounted ConfigMap changes


@dataclass
class ReloadState:
    """What /admin/config shows."""

    files: tuple[Path, Path]
    last_error: list[ConfigIssue] = field(default_factory=list)
    last_error_at: float | None = None
    reloads: int = 0


class ConfigReloader:
    def __init__(self, routes: Path, policy: Path, apply: Callable[[GatewayConfig], None],
                 prepare: Callable[[GatewayConfig], None] = lambda config: None) -> None:
        # absolute, symlinks kept: a Kubernetes ConfigMap volume publishes a new version by swapping
        # its `..data` symlink, so resolving would pin the old version's folder (deleted on update)
        self.state = ReloadState((Path(os.path.abspath(routes)), Path(os.path.abspath(policy))))
        swaps = [path.parent / CONFIGMAP_DATA for path in self.state.files]
        self._names = frozenset(str(path) for path in (*self.state.files, *swaps))  # compared as given: no syscalls
        self._apply = apply
        self._prepare = prepare  # slow work for a new version (tokenizers): runs off the event loop
        self._lock = asyncio.Lock()

    async def reload(self) -> bool:
        """Load, validate and prepare the files; swap them in if all of it succeeded."""
        async with self._lock:
            routes, policy = self.state.files
            try:
                config = await asyncio.to_thread(self._load, routes, policy)
            except ConfigError as err:
                self.state.last_error, self.state.last_error_at = list(err.issues), time.time()
                log.error("config_rejected", issues=[str(i) for i in err.issues])
                return False
            self._apply(config)
            self.state.reloads += 1
            self.state.last_error, self.state.last_error_at = [], None
            log.info("config_loaded", version=config.version, tiers=list(config.tiers))
            return True

    def _load(self, routes: Path, policy: Path) -> GatewayConfig:
        config = load_config(routes, policy)
        self._prepare(config)
        return config

    async def watch(self, stop: asyncio.Event) -> None:
        """Reload on every change to either file, and on SIGHUP, until `stop` is set."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload()))
        folders = {path.parent for path in self.state.files}
        try:
            async for changes in watchfiles.awatch(*folders, stop_event=stop, debounce=100, step=200,
                                                   watch_filter=self._is_ours):
                if changes:
                    await self.reload()
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    def _is_ours(self, change: watchfiles.Change, path: str) -> bool:
        """Called for every change in the watched folders (a log file there too): a set lookup only."""
        return path in self._names
