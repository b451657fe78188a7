"""The cost report's reader: plain + gzip in order, malformed lines counted, date filter, exact money."""

from __future__ import annotations

import gzip
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from gateway.accounting.reader import ReadStats, read_records
from gateway.accounting.records import Record, Skip, explain, parse_line


def request(**overrides: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "request_id": "r1", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "tier": "small",
        "status": 200, "outcome": "ok", "prompt_tokens": 10, "completion_tokens": 5, "ttft_ms": 12.5,
        "e2e_ms": 80.0, "cache": "miss", "cost_usd": 0.000123, "avoided_cost_usd": 0.0,
        "baseline_cost_usd": 0.001, "saved_usd": 0.000877, "level": "info", "event": "request",
    }  # fmt: skip
    line.update(overrides)
    return line


def dumps(**overrides: Any) -> bytes:
    return orjson.dumps(request(**overrides)) + b"\n"


def test_plain_and_gzip_files_are_read_in_the_order_given(tmp_path: Path) -> None:
    old = tmp_path / "requests.log.2.gz"
    with gzip.open(old, "wb") as f:
        f.write(dumps(request_id="a", tenant="t-old") + dumps(request_id="b", tenant="t-old"))
    mid = tmp_path / "requests.log.1"
    mid.write_bytes(dumps(tenant="t-mid"))
    odd = tmp_path / "rotated-without-suffix"  # gzip'd, name says nothing: found by magic bytes
    odd.write_bytes(gzip.compress(dumps(tenant="t-odd")))
    stats = ReadStats()
    tenants = [r.tenant for r in read_records([old, mid, odd], stats)]
    assert tenants == ["t-old", "t-old", "t-mid", "t-odd"]
    assert (stats.files, stats.lines, stats.records, stats.malformed) == (3, 4, 4, 0)


def test_malformed_lines_are_counted_by_kind_and_not_fatal(tmp_path: Path) -> None:
    bad = [
        b"not json at all\n",
        b'{"event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "co\n',  # truncated
        b"[1, 2, 3]\n",
        orjson.dumps({k: v for k, v in request().items() if k != "status"}) + b"\n",
        dumps(cost_usd=None),
        dumps(tenant=7),
        dumps(prompt_tokens=-1),
        dumps(prompt_tokens=1.5),
        dumps(e2e_ms="fast"),
        dumps(ts="yesterday"),
        dumps(cost_usd=-0.5),
        dumps(stream=True, status=True),  # bool is not an HTTP status
    ]
    good = [dumps(), dumps(tier=None, ttft_ms=None, cost_usd=0)]
    other = [orjson.dumps({"event": "config reloaded", "level": "info"}) + b"\n", b"\n"]
    path = tmp_path / "requests.log"
    path.write_bytes(b"".join(good[:1] + bad + other + good[1:]))
    stats = ReadStats()
    records = list(read_records([path], stats))
    assert len(records) == 2 and stats.records == 2
    assert stats.skipped[Skip.NOT_JSON] == 1  # the truncated line: text lines are counted apart
    assert stats.skipped[Skip.TEXT] == 2 and stats.first_text == f"{path}:2"  # not a JSON object: console text
    assert stats.skipped[Skip.MISSING_FIELD] == 2
    assert stats.skipped[Skip.WRONG_TYPE] == 7
    assert stats.malformed == 10 and stats.lines == 16
    assert stats.skipped[Skip.OTHER_EVENT] == 1 and stats.skipped[Skip.BLANK] == 1
    assert stats.examples[0].startswith(f"{path}:3: not JSON")
    assert len(stats.examples) == 3 and stats.examples[2] == f"{path}:6: missing field: cost_usd"
    assert explain(bad[3]) == "missing field: status" and explain(bad[5]) == "wrong type: tenant"


def test_truncated_gzip_ends_that_file_only(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(dumps(request_id=str(i)) for i in range(2000)))
    cut = tmp_path / "requests.log.3.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    after = tmp_path / "requests.log"
    after.write_bytes(dumps(tenant="after"))
    stats = ReadStats()
    records = list(read_records([cut, after], stats))
    assert records[-1].tenant == "after"
    assert len(stats.file_errors) == 1 and str(cut) in stats.file_errors[0]


def test_date_filter_is_inclusive_utc_days(tmp_path: Path) -> None:
    stamps = [
        "2026-11-19T23:59:59.999+00:00",
        "2026-11-20T00:00:00.000+00:00",
        "2026-11-20T23:30:00.000-02:00",  # 01:30 UTC on the 21st
        "2026-11-21T23:59:59.999Z",
        "2026-11-22T00:00:00.000+00:00",
    ]
    path = tmp_path / "requests.log"
    path.write_bytes(b"".join(dumps(ts=ts) for ts in stamps))
    stats = ReadStats()
    days = [r.day for r in read_records([path], stats, date(2026, 11, 20), date(2026, 11, 21))]
    assert days == [date(2026, 11, 20), date(2026, 11, 21), date(2026, 11, 21)]
    assert stats.out_of_range == 2 and stats.records == 3
    only_from = [r.day for r in read_records([path], ReadStats(), day_from=date(2026, 11, 22))]
    assert only_from == [date(2026, 11, 22)]


def test_money_is_read_from_the_token_text_exactly() -> None:
    line = dumps().replace(b'"cost_usd":0.000123', b'"cost_usd": 0.10000000000000000001')
    record = parse_line(line)
    assert isinstance(record, Record)
    assert record.cost == Decimal("0.10000000000000000001")  # float(...) would say 0.1
    assert record.baseline == Decimal("0.001") and record.saved == Decimal("0.000877")


def test_lines_without_baseline_are_unpriced_and_derivable_fields_are_derived() -> None:
    old = request(cost_usd=0.002)
    del old["baseline_cost_usd"], old["saved_usd"], old["avoided_cost_usd"]
    record = parse_line(orjson.dumps(old))
    assert isinstance(record, Record)
    assert not record.priced_baseline
    assert (record.baseline, record.saved, record.avoided) == (0, 0, 0)
    half = request(cost_usd=0.25)
    del half["saved_usd"]
    record = parse_line(orjson.dumps(half | {"baseline_cost_usd": 1.0}))
    assert isinstance(record, Record) and record.priced_baseline and record.saved == Decimal("0.75")
