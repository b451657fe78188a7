"""SingleFlight: per key, one fetch at a time in the process; its flights end however it ends."""

import asyncio

import pytest

from gateway.cache.singleflight import SingleFlight


async def test_a_batch_leads_the_free_keys_and_joins_the_others() -> None:
    flights: SingleFlight[str, str] = SingleFlight()
    release, fetched = asyncio.Event(), []

    async def fetch(keys: list[str]) -> list[str]:
        fetched.append(keys)
        await release.wait()
        return [key.upper() for key in keys]

    first = flights.join(["a", "b"], fetch, lambda values: values)
    second = flights.join(["b", "c"], fetch, lambda values: values)
    assert (first.led, list(first.joined), second.led, list(second.joined)) == (["a", "b"], [], ["c"], ["b"])
    assert len(flights) == 3
    release.set()
    assert second.fetch is not None and await second.fetch == ["C"]
    assert await second.joined["b"] == "B" and fetched == [["a", "b"], ["c"]]
    assert len(flights) == 0 and flights.join([], fetch, lambda values: values).fetch is None


@pytest.mark.parametrize("ending", ["raises", "cancelled", "bad values"])
async def test_a_fetch_that_fails_gives_its_waiters_none_and_ends_its_flights(ending: str) -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    started = asyncio.Event()

    async def fetch(keys: list[str]) -> list[int]:
        started.set()
        if ending == "raises":
            raise RuntimeError("upstream down")
        if ending == "cancelled":
            await asyncio.sleep(3600)
        return [1, 2]

    def values(got: list[int]) -> list[int]:
        if ending == "bad values":
            raise ValueError("not one value per key")
        return got

    lead = flights.join(["a", "b"], fetch, values)
    wait = flights.join(["a", "b"], fetch, values)
    assert lead.fetch is not None and wait.fetch is None
    await started.wait()
    if ending == "cancelled":
        lead.fetch.cancel()
    await asyncio.wait([lead.fetch])
    async with asyncio.timeout(1):
        assert [await wait.joined["a"], await wait.joined["b"]] == [None, None]
    assert len(flights) == 0
