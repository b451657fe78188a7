import random
from datetime import UTC, datetime

from gateway.clock import day_key, iso_ms, utc_day


def test_the_cached_formats_equal_datetimes_own() -> None:
    draws = random.Random(7)
    moments = [draws.uniform(0, 2e9) for _ in range(20000)] + [1976242161.03, 1795305599.9995, 1795305600.0]
    for ts in moments:
        moment = datetime.fromtimestamp(ts, UTC)
        assert iso_ms(ts) == moment.isoformat(timespec="milliseconds")
        assert utc_day(ts) == moment.date()
        assert day_key(ts) == moment.strftime("%Y%m%d")
