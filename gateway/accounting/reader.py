"""Stream request records from plain and gzip'd log files, one line at a time.

Files are read in the order given (`requests.log.2.gz requests.log.1 requests.log`), gzip being
recognised by its magic bytes rather than its name. Nothing is held but the current line, so
memory does not depend on file size. Malformed lines are counted (with the first few located
by file and line number) and skipped; text lines (console output such as `gateway up`'s banner, captured
with the log by `2>&1`) are counted apart, the first one located; a gzip file cut short, as a rotation in progress leaves
it, ends that file with a counted error instead of ending the run.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from gateway.accounting.records import Record, Skip, explain, parse_line

GZIP_MAGIC = b"\x1f\x8b"
MALFORMED = (Skip.NOT_JSON, Skip.MISSING_FIELD, Skip.WRONG_TYPE)
MAX_EXAMPLES = 3
_BUFFER = 1 << 20


@dataclass(slots=True)
class ReadStats:
    """What the reader saw: lines by fate, the first malformed lines, unreadable file tails."""

    files: int = 0
    lines: int = 0
    records: int = 0  # inference request lines kept (inside the date range)
    edge_lines: int = 0  # other endpoints' lines kept (dashboard, admin, static, ...: `edge` records, cost 0)
    shadow_lines: int = 0  # shadow comparison lines kept (their spend: `shadow_only` records)
    out_of_range: int = 0
    first_day: date | None = None  # of the records kept
    last_day: date | None = None
    skipped: Counter[Skip] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    first_text: str | None = None  # file:line of the first text line (not a JSON object: console output)
    file_errors: list[str] = field(default_factory=list)

    @property
    def malformed(self) -> int:
        return sum(self.skipped[reason] for reason in MALFORMED)


def open_log(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed when it starts with the gzip magic (the caller closes it)."""
    raw = io.BufferedReader(io.FileIO(path, "rb"), _BUFFER)
    if raw.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def read_lines(path: Path, stats: ReadStats) -> Iterator[bytes]:
    """The file's lines; a corrupt or truncated gzip stream ends the file and is noted in `stats`."""
    stats.files += 1
    count = 0
    with open_log(path) as stream:
        try:
            for count, line in enumerate(stream, start=1):  # noqa: B007 - count is reported below
                yield line
        except (EOFError, OSError, zlib.error) as exc:
            stats.file_errors.append(f"{path}: unreadable after line {count}: {exc}")


def read_records(
    paths: Iterable[Path], stats: ReadStats, day_from: date | None = None, day_to: date | None = None
) -> Iterator[Record]:
    """Valid request records (and shadow lines' spend records) from `paths`, in order, whose UTC day lies in
    [day_from, day_to]."""
    for path in paths:
        for number, line in enumerate(read_lines(path, stats), start=1):
            stats.lines += 1
            result = parse_line(line)
            if not isinstance(result, Skip):
                records = (result,) if isinstance(result, Record) else result
                day = records[0].day
                if (day_from is not None and day < day_from) or (day_to is not None and day > day_to):
                    stats.out_of_range += 1
                    continue
                if records[0].shadow_only:
                    stats.shadow_lines += 1
                elif records[0].edge:
                    stats.edge_lines += 1
                else:
                    stats.records += 1
                if stats.first_day is None or day < stats.first_day:
                    stats.first_day = day
                if stats.last_day is None or day > stats.last_day:
                    stats.last_day = day
                yield from records
                continue
            stats.skipped[result] += 1
            if result in MALFORMED and len(stats.examples) < MAX_EXAMPLES:
                stats.examples.append(f"{path}:{number}: {explain(line)}")
            elif result is Skip.TEXT and stats.first_text is None:
                stats.first_text = f"{path}:{number}"
