"""Hot reload: watch the routes and policy files (and SIGHUP); a new version replaces the serving one
only after it validated completely. A bad file is refused with file, line, field and reason, and the
last good version keeps serving. In-flight requests keep the version they started with."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import watchfiles

from gateway.config import ConfigError, ConfigIssue, GatewayConfig, load_config
from gateway.config.loader import locate
from gateway.config.removals import check_removals

log = structlog.get_logger("gateway.config")
WATCH_RETRY_S = 1.0  # a file watcher that failed (its folder gone, a watch limit) is restarted after this
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
                 prepare: Callable[[GatewayConfig], None] = lambda config: None,
                 serving: GatewayConfig | None = None) -> None:
        # absolute, symlinks kept: a Kubernetes ConfigMap volume publishes a new version by swapping
        # its `..data` symlink, so resolving would pin the old version's folder (deleted on update)
        self.state = ReloadState((Path(os.path.abspath(routes)), Path(os.path.abspath(policy))))
        swaps = [path.parent / CONFIGMAP_DATA for path in self.state.files]
        self._names = frozenset(str(path) for path in (*self.state.files, *swaps))  # compared as given: no syscalls
        self._apply = apply
        self._prepare = prepare  # slow work for a new version (tokenizers): runs off the event loop
        self._lock = asyncio.Lock()
        self._serving = serving  # the version serving now: a reload compares the new policy with it (`removes:`)
        self._tasks: set[asyncio.Task[bool]] = set()

    async def reload(self) -> bool:
        """Load, validate and prepare the files; swap them in if all of it succeeded. Never raises: whatever goes
        wrong (a refused file, a tokenizer that does not load, a bug) is logged and shown in /admin/config, and
        the last good version keeps serving."""
        async with self._lock:
            routes, policy = self.state.files
            try:
                config = await asyncio.to_thread(self._load, routes, policy)
            except ConfigError as err:
                return self._refused(list(err.issues))
            except Exception as err:  # not a verdict on the files, but the reload must not take serving down
                log.exception("config_reload_failed")
                return self._refused([ConfigIssue(str(routes), None, "(reload)", "-", _reason(err))])
            try:
                self._apply(config)
            except Exception as err:
                log.exception("config_reload_failed")
                return self._refused([ConfigIssue(str(routes), None, "(apply)", "-", _reason(err))])
            self.state.reloads += 1
            self.state.last_error, self.state.last_error_at = [], None
            self._serving = config
            log.info("config_loaded", version=config.version, tiers=list(config.tiers))
            return True

    def _refused(self, issues: list[ConfigIssue]) -> bool:
        self.state.last_error, self.state.last_error_at = issues, time.time()
        log.error("config_rejected", issues=[str(i) for i in issues])
        return False

    def _load(self, routes: Path, policy: Path) -> GatewayConfig:
        """What the server would serve, validated whole: both files, their tokenizers built (`prepare`), and
        nothing the serving version limits lost without the new policy's `removes:` saying so."""
        config = load_config(routes, policy)
        try:
            self._prepare(config)
        except ConfigError as err:  # the tokenizers: named by tier, placed in the routes file
            raise locate(err, routes) from None
        if self._serving is not None:
            check_removals(self._serving.policy, config.policy, policy)
        return config

    async def watch(self, stop: asyncio.Event) -> None:
        """Reload on every change to either file, and on SIGHUP, until `stop` is set. Nothing ends the watch early:
        a failing file watcher is logged and restarted, and SIGHUP stays handled (never the default: death)
        until the process exits, after `stop` too (a SIGHUP during the drain is logged and ignored)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup, loop)
        folders = {path.parent for path in self.state.files}
        try:
            while not stop.is_set():
                try:
                    async for changes in watchfiles.awatch(*folders, stop_event=stop, debounce=100, step=200,
                                                           watch_filter=self._is_ours):
                        if changes:
                            await self.reload()
                except Exception:
                    log.exception("config_watch_failed", retry_in_s=WATCH_RETRY_S)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), WATCH_RETRY_S)
        finally:
            loop.add_signal_handler(signal.SIGHUP, _ignore_sighup)

    def _on_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        log.info("sighup", action="reload")
        task = loop.create_task(self.reload())
        self._tasks.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(self._tasks.discard)

    def _is_ours(self, change: watchfiles.Change, path: str) -> bool:
        """Called for every change in the watched folders (a log file there too): a set lookup only."""
        return path in self._names


def _reason(err: Exception) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 300 else text[:300] + "..."


def _ignore_sighup() -> None:
    log.warning("sighup_ignored", reason="shutting down")
