"""RedisGuard: every Redis call of the request path goes through `run`, which never raises.

State is kept per node (gateway.cache.nodes): a single server or Sentinel master is one node; on a Redis
Cluster each master is one, and a call goes to the master owning its key's slot (`run(..., key=...)`),
so one master's failure skips only the calls whose keys live there: tenants on the other masters keep
their global limits and their caches.

A connection error, a cluster error that says the node will not serve (CLUSTERDOWN, TRYAGAIN, LOADING,
READONLY: gateway.cache.nodes.classify), or `timeouts_to_down` timeouts in a row lasting `down_after_s`
with no success between them (a reply that arrives after its call gave up counts as a success: Redis is
slow, not down), returns None and marks that node down for `down_backoff_s`: calls for it in that window
return None at once (no connect-timeout tax per request), then a single probe call goes through; its
success marks the node up again (a probe that meets a cluster error keeps it down: no flapping). A
timeout alone only returns None: the budget is measured from the event loop, so one stall times out every
call pending at that moment, and that is not an outage. Calls are shielded: giving up on a reply does not
cancel the read (which would drop the connection). Other errors (a bad command, a wrong type, a MOVED
that outlived the client's own redirects) return None too but leave the node up.

Metrics: `gateway_redis_up` (1 when every node answers), `gateway_redis_node_up{node}`,
`gateway_redis_slots_unavailable` (slots whose master is down; 16384 when the whole of Redis is),
`gateway_redis_errors_total{op}`, `gateway_redis_error_kinds_total{kind}`, `gateway_redis_op_seconds{op}`;
logs: `redis_unavailable` (at most one per `warn_every_s` per node), `redis_recovered{node}`,
`redis_failed_over{node, to}` (a cluster master's slots, or a Sentinel's master, served by another node now),
`redis_op_failed` (rate-limited the same way). Behind Sentinel, /readyz's nodes down name the master that failed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.cache.connection import RedisClient
from gateway.cache.nodes import DOWN_KINDS, SLOTS, UNASSIGNED, WHOLE, Keys, Topology, classify

T = TypeVar("T")
OP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)  # up to the limiter's 2 s

log = structlog.get_logger("gateway.redis")


@dataclass(slots=True)
class NodeState:
    up: bool = True
    retry_at: float = 0.0  # while down: when the next probe may go
    probing: bool = False
    timeouts: int = 0  # in a row
    first_timeout_at: float = 0.0
    since: float = 0.0  # when it went down
    master: str | None = None  # Sentinel: the master it was when it went down (Topology.master)


@dataclass(frozen=True, slots=True)
class RedisStatus:
    """What /readyz says: `up`, `partial` (some masters down) or `down`; the masters down, slots lost."""

    state: str
    nodes_down: tuple[str, ...]
    slots_unavailable: int


class RedisGuard:
    """Runs Redis operations with a short timeout; skips those for nodes known to be down."""

    def __init__(
        self, client: RedisClient, *, op_timeout_s: float = 0.005, down_backoff_s: float = 1.0,
        registry: CollectorRegistry | None = None, warn_every_s: float = 10.0, timeouts_to_down: int = 3,
        down_after_s: float = 0.25,
    ) -> None:
        self.client = client
        self.topology = Topology(client)
        self.op_timeout_s = op_timeout_s
        self.down_backoff_s = down_backoff_s
        self.warn_every_s = warn_every_s
        self.timeouts_to_down = timeouts_to_down
        self.down_after_s = down_after_s
        self._nodes: dict[str, NodeState] = {}
        self._down: set[str] = set()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._last_warning: dict[str, float] = {}
        self._up_gauge = Gauge("gateway_redis_up", "1 when every Redis node answers, 0 while one is skipped",
                               registry=self.registry)
        self._up_gauge.set(1)
        self._node_up = Gauge("gateway_redis_node_up", "Per Redis node (a cluster master, or * for a single "
                              "server): 0 while its calls are skipped", ("node",), registry=self.registry)
        self._slots = Gauge("gateway_redis_slots_unavailable", "Hash slots whose master is down (cluster); "
                            "16384 while the whole of Redis is", registry=self.registry)
        self._slots.set_function(lambda: self.status().slots_unavailable)
        self._errors = Counter("gateway_redis_errors", "Redis operations that failed or timed out", ("op",),
                               registry=self.registry)
        self._kinds = Counter("gateway_redis_error_kinds", "Redis errors by kind (gateway.cache.nodes.classify; "
                              "timeout)", ("kind",), registry=self.registry)
        self._seconds = Histogram("gateway_redis_op_seconds", "Redis operation latency (successful ones)",
                                  ("op",), buckets=OP_BUCKETS, registry=self.registry)
        self._children: dict[str, tuple[Histogram, Counter]] = {}

    @property
    def up(self) -> bool:
        """Every node answers (a cluster with one master down is not `up`: see `up_for`)."""
        return not self._down

    def up_for(self, key: Keys) -> bool:
        """The nodes holding `key` answer (and the cluster as a whole is reachable)."""
        return not self._down or not (self.topology.nodes_of(key) | {WHOLE}) & self._down

    def status(self) -> RedisStatus:
        if not self._down:
            return RedisStatus("up", (), 0)
        if WHOLE in self._down:  # Sentinel: named by the master that failed
            named = {self._nodes[name].master or name if name in self._nodes else name for name in self._down}
            return RedisStatus("down", tuple(sorted(named)), SLOTS)
        slots = self.topology.slots_by_master()
        owning = {name for name in self._down if name in slots}
        unassigned = SLOTS - sum(slots.values()) if UNASSIGNED in self._down else 0
        lost = sum(slots[name] for name in owning) + unassigned
        for gone in self._down - owning - ({UNASSIGNED} if unassigned else set()):  # failed over: its slots are served elsewhere now
            log.info("redis_failed_over", node=gone, down_s=round(time.monotonic() - self._state(gone).since, 3))
            self._forget(gone)
        names = tuple(sorted(owning | ({UNASSIGNED} if unassigned else set())))
        if not names:
            return RedisStatus("up", (), 0)
        return RedisStatus("down" if lost >= SLOTS else "partial", names, lost)

    def _metrics(self, op: str) -> tuple[Histogram, Counter]:
        pair = self._children.get(op)
        if pair is None:
            pair = self._children[op] = (self._seconds.labels(op), self._errors.labels(op))
        return pair

    def _state(self, name: str) -> NodeState:
        state = self._nodes.get(name)
        if state is None:
            state = self._nodes[name] = NodeState()
        return state

    def _admit(self, targets: set[str]) -> list[NodeState] | None:
        """None: skip the call (a target is down and not due for its probe); else the probes it carries."""
        probes = []
        for name in targets | {WHOLE} if self._down else ():
            state = self._nodes.get(name)
            if state is None or state.up:
                continue
            if state.probing or time.monotonic() < state.retry_at:
                return None
            probes.append(state)
        for state in probes:
            state.probing = True
        return probes

    async def run(self, op: str, call: Callable[[], Awaitable[T]], timeout_s: float | None = None, *,
                  key: Keys = None) -> T | None:
        """`await call()` within the timeout; None if the node holding `key` is down, slow or the call failed.

        `key`: the key (or keys) the call touches; on a cluster it names the master. Without one, a call
        is the cluster's as a whole (skipped only while no node can be reached)."""
        targets = self.topology.nodes_of(key)
        probes = self._admit(targets)
        if probes is None:
            return None
        seconds, errors = self._metrics(op)
        start = time.perf_counter()
        reply: asyncio.Future[T] | None = None
        try:
            # shielded: giving up on a slow reply must not cancel the read, which would drop the
            # connection and make the next call pay for a reconnect inside its own budget
            reply = asyncio.ensure_future(call())
            result = await asyncio.wait_for(asyncio.shield(reply), timeout_s or self.op_timeout_s)
        except (TimeoutError, RedisTimeoutError) as err:
            errors.inc()
            self._kinds.labels("timeout").inc()
            if reply is not None and not reply.done():  # the reply may still come
                reply.add_done_callback(lambda done: self._late_reply(done, targets))
            self._timed_out(op, err, targets, bool(probes))
            return None
        except Exception as err:  # never raise to the request path
            errors.inc()
            self._failed(op, err, targets, bool(probes))
            return None
        finally:
            for state in probes:
                state.probing = False
        seconds.observe(time.perf_counter() - start)
        self._succeeded(targets, key)
        return result

    def _succeeded(self, targets: set[str], key: Keys) -> None:
        for name in targets:
            state = self._nodes.get(name)
            if state is not None:
                state.timeouts = 0
        if self._down:
            # the call may have been redirected after the slot map was rebuilt (a failover): a node
            # is up again only if the key still maps to it; a failed-over one is forgotten by status()
            answered = self.topology.nodes_of(key) & targets if self.topology.cluster is not None else targets
            for name in (answered | {WHOLE}) & self._down:
                self._mark_up(name)

    def _timed_out(self, op: str, err: BaseException, targets: set[str], probe: bool) -> None:
        now = time.monotonic()
        for name in targets:
            state = self._state(name)
            if state.timeouts == 0:
                state.first_timeout_at = now
            state.timeouts += 1
            # one event-loop stall times out every call pending at that moment: a node is marked down
            # only when timeouts go on for `down_after_s` with no success in between
            lasting = now - state.first_timeout_at >= self.down_after_s
            if probe or (state.timeouts >= self.timeouts_to_down and lasting):
                self._mark_down(name, op, err)

    def _failed(self, op: str, err: BaseException, targets: set[str], probe: bool) -> None:
        kind = classify(err)
        self._kinds.labels(kind).inc()
        if kind in DOWN_KINDS:
            for name in self.topology.blame(err, targets):
                self._mark_down(name, op, err)
            return
        self._warn("redis_op_failed", op, err)
        if probe and kind == "other":  # it answered, so it is up
            for name in targets | {WHOLE}:
                if name in self._down:
                    self._mark_up(name)

    def _late_reply(self, reply: asyncio.Future[Any], targets: set[str]) -> None:
        """A reply that came after its call gave up: a success means Redis is slow, not gone (the
        timeouts in a row so far do not count); an error that says the node is down marks it down."""
        if reply.cancelled():
            return
        err = reply.exception()
        if err is None:
            for name in targets:
                self._state(name).timeouts = 0
        elif classify(err) in DOWN_KINDS:
            for name in self.topology.blame(err, targets):
                self._mark_down(name, "late_reply", err)

    def _mark_down(self, name: str, op: str, err: BaseException) -> None:
        state = self._state(name)
        state.retry_at = time.monotonic() + self.down_backoff_s
        if state.up:
            state.up = False
            state.since = time.monotonic()
            state.master = self.topology.master() if name == WHOLE else None
            self._down.add(name)
            self._up_gauge.set(0)
            self._node_up.labels(name).set(0)
        self._warn("redis_unavailable", op, err, state.master or name)  # Sentinel: the master that failed

    def _mark_up(self, name: str) -> None:
        state = self._state(name)
        was_down_s, before, now = time.monotonic() - state.since, state.master, self.topology.master()
        self._forget(name)
        if before is not None and now is not None and now != before:  # Sentinel promoted another node
            log.info("redis_failed_over", node=before, to=now, down_s=round(was_down_s, 3))
        else:
            log.info("redis_recovered", node=before or name, down_s=round(was_down_s, 3))

    def _forget(self, name: str) -> None:
        state = self._state(name)
        state.up, state.timeouts = True, 0
        self._down.discard(name)
        self._node_up.labels(name).set(1)
        if not self._down:
            self._up_gauge.set(1)

    def _warn(self, event: str, op: str, err: BaseException, node: str | None = None) -> None:
        now = time.monotonic()
        which = f"{event}:{node}"
        if now - self._last_warning.get(which, -self.warn_every_s) >= self.warn_every_s:
            self._last_warning[which] = now
            fields = {"node": node} if node is not None else {}
            log.warning(event, op=op, error=f"{type(err).__name__}: {err}", **fields)
