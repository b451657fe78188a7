"""Single flight: a value already being fetched in this process is not fetched again; who asks meanwhile waits.

    flight = flights.join(keys, lambda led: fetch(led), lambda answer: answer.values)
    answer = await asyncio.shield(flight.fetch)       # the keys this caller leads (when it leads any)
    value = await asyncio.shield(flight.joined[key])  # another caller's fetch: its value, None if that failed

Per key: a batch leads the keys no fetch is getting and joins the fetches of the others. A fetch is a
task of its own, so the cancellation of the caller that started it (a client that left) stops neither
it nor the others' wait; shield what you await. When it ends, however it ends, its keys' flights end:
each waiter gets the key's value, or None when the fetch failed or was cancelled (the waiter then
decides: fetch it itself, or fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Flight(Generic[K, V, R]):
    led: list[K]  # the keys the caller's own fetch gets, in the order given to it
    fetch: asyncio.Task[R] | None  # that fetch; None: the caller leads no key
    joined: dict[K, asyncio.Future[V | None]]  # the other keys: the value of the fetch under way, None if it failed


class SingleFlight(Generic[K, V]):
    """The fetches under way in this process, by key."""

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # the fetches, held until they end (the loop keeps weak references)

    def __len__(self) -> int:
        """The keys being fetched."""
        return len(self._flights)

    def join(self, keys: Sequence[K], fetch: Callable[[list[K]], Coroutine[Any, Any, R]],
             values: Callable[[R], Iterable[V]]) -> Flight[K, V, R]:
        """Join the fetches under way of `keys`, and start `fetch` of the others as a task; its `values`
        (one per key, in order) go to whoever joins it. Distinct keys."""
        loop = asyncio.get_running_loop()
        led = [key for key in keys if key not in self._flights]
        joined = {key: self._flights[key] for key in keys if key in self._flights}
        if not led:
            return Flight(led, None, joined)
        task = loop.create_task(fetch(led))
        self._tasks.add(task)
        for key in led:
            self._flights[key] = loop.create_future()
        task.add_done_callback(lambda done: self._land(led, done, values))
        return Flight(led, task, joined)

    def _land(self, keys: list[K], done: asyncio.Task[R], values: Callable[[R], Iterable[V]]) -> None:
        """`done` ended: its keys' waiters get their values (None if it failed); its flights end, whatever happens."""
        self._tasks.discard(done)
        got: list[V] = []
        try:
            if not done.cancelled() and done.exception() is None:  # exception() also marks the error as seen
                got = list(values(done.result()))
        finally:
            for i, key in enumerate(keys):
                flight = self._flights.pop(key)
                if not flight.done():
                    flight.set_result(got[i] if i < len(got) else None)
