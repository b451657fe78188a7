"""Where a Redis call goes and what its failure means: the guard's per-node view (issue 41).

A single server or a Sentinel-managed master is one node, WHOLE (for Sentinel, `Topology.master` names
the master the client last reached, so /readyz and the logs can say which one failed and which took over). On a Redis Cluster a call goes to the
master owning its key's hash slot, read from the client's own slot map (no round trip): a failure is
that master's, and calls whose keys live on the other masters go on. WHOLE there means the cluster as a
whole (no seed reachable, or a keyless call); UNASSIGNED a slot that no master serves in the map.

Errors, by what they say about the node that raised them:

    unavailable  ConnectionError (refused, reset, auth), OSError, a cluster that cannot be reached
                 at all (RedisClusterException from the slot-map refresh)      -> node down
    cluster_down CLUSTERDOWN (the node will not serve: its slots or the cluster are failed),
                 MASTERDOWN, SlotNotCovered                                     -> node down
    failover     TRYAGAIN, LOADING (a node restarting), READONLY (a master just demoted: the
                 client still writes to it)                                      -> node down
    moved        MOVED/ASK that outlived redis-py's own redirects (TTL exhausted): the slot map is
                 being rebuilt, the node is fine                                 -> stays up
    closed       a connection closed under the call ("handler is closed")        -> stays up
    other        a bad command, a wrong type: Redis answered                     -> stays up

"node down" means down for the guard's backoff, then one probe call decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.cache.connection import RedisClient

WHOLE = "*"  # the one node of a single server; the cluster as a whole
UNASSIGNED = "unassigned"  # a slot no master serves in the client's map
SLOTS = 16384
Kind = Literal["unavailable", "cluster_down", "failover", "moved", "closed", "other"]
DOWN_KINDS: frozenset[Kind] = frozenset({"unavailable", "cluster_down", "failover"})
Keys = str | bytes | Sequence[str | bytes] | None
CONNECTING_TO = re.compile(r"connecting to (\S+):(\d+)")  # redis-py's "Error 111 connecting to h:p."


def classify(err: BaseException) -> Kind:
    """What an error says about the node that raised it (see the module docstring)."""
    if isinstance(err, (ClusterDownError, MasterDownError, SlotNotCoveredError)):
        return "cluster_down"
    if isinstance(err, (TryAgainError, BusyLoadingError, ReadOnlyError)):
        return "failover"
    if isinstance(err, (RedisConnectionError, OSError, RedisClusterException)):
        return "unavailable"
    if isinstance(err, (AskError, ClusterError)):  # MovedError is an AskError; ClusterError: TTL exhausted
        return "moved"
    if isinstance(err, RuntimeError) and "closed" in str(err):
        return "closed"
    return "other"


class Topology:
    """Node names for keys, from the client's slot map (a cluster) or WHOLE (anything else)."""

    def __init__(self, client: RedisClient) -> None:
        self.cluster: RedisCluster | None = client if isinstance(client, RedisCluster) else None
        pool = getattr(client, "connection_pool", None)
        self.sentinel: SentinelConnectionPool | None = pool if isinstance(pool, SentinelConnectionPool) else None

    def master(self) -> str | None:
        """Sentinel: 'host:port' of the master the client's connections last went to (the sentinels' answer at
        the last new connection); None before the first one, and for a single server or a cluster."""
        address = self.sentinel.master_address if self.sentinel is not None else None
        return f"{address[0]}:{address[1]}" if address else None

    def nodes_of(self, keys: Keys) -> set[str]:
        cluster = self.cluster
        if cluster is None or keys is None:
            return {WHOLE}
        slots_cache = cluster.nodes_manager.slots_cache
        if not slots_cache:  # the map is not read yet (first call) or is being rebuilt
            return {WHOLE}
        names = set()
        for key in [keys] if isinstance(keys, (str, bytes)) else keys:
            owners = slots_cache.get(cluster.keyslot(key))
            names.add(owners[0].name if owners else UNASSIGNED)
        return names

    def blame(self, err: BaseException, targets: Iterable[str]) -> set[str]:
        """The nodes an error is about: the node redis-py names on it (or its message does), else the call's
        own nodes. On a cluster an error no node can be named for is nobody's (a pipeline's, a keyless call's):
        WHOLE is blamed only when no node at all could be reached."""
        names = set(targets)
        if self.cluster is None:
            return names
        node: Any = getattr(err, "connection", None)
        name = getattr(node, "name", None) or getattr(err, "last_failed_node_name", None)
        if isinstance(name, str):
            return {name}
        if isinstance(err, RedisClusterException) and not isinstance(err, SlotNotCoveredError):
            return {WHOLE}  # the slot map could not be read from any node
        if (found := CONNECTING_TO.search(str(err))) is not None:
            return {f"{found[1].strip('[]')}:{found[2]}"}
        return names - {WHOLE}

    def slots_by_master(self) -> dict[str, int]:
        """Slots each master serves in the client's map (empty for a single server)."""
        counts: dict[str, int] = {}
        if self.cluster is None:
            return counts
        seen: dict[int, str] = {}
        for owners in self.cluster.nodes_manager.slots_cache.values():
            if owners:  # slot ranges share one list: count per list, then per slot
                name = seen.get(id(owners))
                if name is None:
                    name = seen[id(owners)] = owners[0].name
                counts[name] = counts.get(name, 0) + 1
        return counts
