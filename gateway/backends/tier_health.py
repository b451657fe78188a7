"""Backend health per tier, for /readyz and the dashboard.

A replica is up when it may be tried now: its last health check passed and its circuit is not open
(`ReplicaStats.available`). A tier is `ready` when all its replicas are up, `degraded` when some are,
`unready` when none is (model 'auto' then routes around it: `gateway.routing.detour`). The gateway's backends
as a whole: `ready` when every tier is, `unready` when no tier is, else `degraded`. Tiers served in
process (an embedder) have no replicas and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypedDict

from gateway.backends.pool import ReplicaPool
from gateway.config import Tier

Health = Literal["ready", "degraded", "unready"]


class TierHealth(TypedDict):
    status: Health
    up: int
    replicas: int
    retry_in_s: float  # when none is up: seconds until one may be tried again (the 503s' Retry-After)


def tier_health(pool: ReplicaPool, tier: Tier, health_interval_s: float) -> TierHealth:
    up = sum(1 for r in tier.replicas if pool.state(r, tier).available())
    status: Health = "ready" if up == len(tier.replicas) else "degraded" if up else "unready"
    retry_in = 0.0 if up else round(pool.retry_in(tier, health_interval_s), 3)
    return {"status": status, "up": up, "replicas": len(tier.replicas), "retry_in_s": retry_in}


def backends_health(pool: ReplicaPool, tiers: Iterable[Tier], health_interval_s: float,
                    ) -> tuple[Health, dict[str, TierHealth]]:
    """The summary over the tiers with replicas, and each one's health."""
    each = {t.name: tier_health(pool, t, health_interval_s) for t in tiers if t.replicas}
    states = {h["status"] for h in each.values()}
    summary: Health = "ready" if states <= {"ready"} else "unready" if states == {"unready"} else "degraded"
    return summary, each
