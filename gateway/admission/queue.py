"""The waiting room of one tier: a queue per priority class, round-robin between tenants inside it.

Interactive requests leave first; `batch_share` of the grants go to batch requests while both wait,
so batch is slowed under load but never starved. Each waiter holds a future the gate resolves.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from gateway.config.policies import Priority

PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")


@dataclass(slots=True, eq=False)
class Waiter:
    tenant: str
    priority: Priority
    future: asyncio.Future[None]
    enqueued_at: float = field(default=0.0)


class WaitQueue:
    def __init__(self) -> None:
        self._classes: dict[Priority, OrderedDict[str, deque[Waiter]]] = {p: OrderedDict() for p in PRIORITIES}
        self._depth: dict[Priority, int] = {p: 0 for p in PRIORITIES}
        self._size = 0  # waiters of all classes
        self._grants = 0

    def __len__(self) -> int:
        return self._size

    def depth(self, priority: Priority) -> int:
        return self._depth[priority]

    def ahead_of(self, priority: Priority) -> int:
        """Waiters that leave before a new request of `priority` (batch waits behind interactive)."""
        return self._depth["interactive"] if priority == "interactive" else len(self)

    def push(self, waiter: Waiter) -> None:
        self._classes[waiter.priority].setdefault(waiter.tenant, deque()).append(waiter)
        self._depth[waiter.priority] += 1
        self._size += 1

    def remove(self, waiter: Waiter) -> bool:
        tenants = self._classes[waiter.priority]
        line = tenants.get(waiter.tenant)
        if line is None or waiter not in line:
            return False
        line.remove(waiter)
        if not line:
            del tenants[waiter.tenant]
        self._depth[waiter.priority] -= 1
        self._size -= 1
        return True

    def pop(self, batch_share: float) -> Waiter | None:
        """The next waiter to admit, or None when nobody waits."""
        priority = self._next_class(batch_share)
        if priority is None:
            return None
        tenants = self._classes[priority]
        tenant, line = next(iter(tenants.items()))
        waiter = line.popleft()
        if line:
            tenants.move_to_end(tenant)  # round robin: this tenant's next request waits for the others
        else:
            del tenants[tenant]
        self._depth[priority] -= 1
        self._size -= 1
        return waiter

    def _next_class(self, batch_share: float) -> Priority | None:
        interactive, batch = self._depth["interactive"], self._depth["batch"]
        if not interactive and not batch:
            return None
        self._grants += 1
        if not interactive:
            return "batch"
        if batch and batch_share > 0 and self._grants % max(1, round(1 / batch_share)) == 0:
            return "batch"
        return "interactive"
