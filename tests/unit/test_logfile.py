from pathlib import Path

import pytest

from gateway.accounting import logfile
from gateway.accounting.logfile import RotatingLogFile


def test_size_rotation_keeps_n_backups_and_loses_no_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.log"
    log = RotatingLogFile(path, max_bytes=100, backups=2)
    lines = [f'{{"n": {i:04d}, "pad": "{"x" * 30}"}}\n'.encode() for i in range(12)]
    for line in lines:
        log.write(line)
        log.flush()
    log.close()
    kept = [p for p in (tmp_path / "requests.log.2", tmp_path / "requests.log.1", path) if p.exists()]
    assert [p.name for p in kept] == ["requests.log.2", "requests.log.1", "requests.log"]
    assert not (tmp_path / "requests.log.3").exists()
    joined = b"".join(p.read_bytes() for p in kept)
    assert joined == b"".join(lines[-len(joined.splitlines()):])  # the newest lines, in order, whole
    assert all(p.stat().st_size <= 100 for p in kept)


def test_daily_rotation_at_midnight_utc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_795_305_600.0 - 10]  # 10 s before 2026-11-22 00:00 UTC
    monkeypatch.setattr(logfile.time, "time", lambda: now[0])
    path = tmp_path / "requests.log"
    log = RotatingLogFile(path, daily=True)
    log.write(b"before midnight\n")
    now[0] += 20
    log.write(b"after midnight\n")
    log.close()
    assert (tmp_path / "requests.log.2026-11-21").read_bytes() == b"before midnight\n"
    assert path.read_bytes() == b"after midnight\n"


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.flushes = 0

    def write(self, data: bytes) -> int:
        self.writes.append(data)
        return len(data)

    def flush(self) -> None:
        self.flushes += 1


async def test_lines_written_in_one_loop_turn_reach_the_file_in_one_write() -> None:
    import asyncio

    from gateway.accounting.log import BatchedStream

    sink = Recorder()
    stream = BatchedStream(sink, delay_s=0.01)
    for n in range(3):
        stream.write(b"line %d\n" % n)
        stream.flush()  # structlog flushes after each line
    assert sink.writes == []
    await asyncio.sleep(0.05)
    assert sink.writes == [b"line 0\nline 1\nline 2\n"] and sink.flushes == 1
    stream.write(b"last\n")
    stream.flush()
    stream.close()  # shutdown: what is pending is written at once
    assert sink.writes[-1] == b"last\n"


def test_outside_an_event_loop_each_flush_writes_and_a_full_buffer_writes_at_once() -> None:
    from gateway.accounting.log import BatchedStream

    sink = Recorder()
    stream = BatchedStream(sink, max_bytes=10)
    stream.write(b"abc\n")
    stream.flush()
    assert sink.writes == [b"abc\n"]
    stream.write(b"0123456789\n")
    assert sink.writes == [b"abc\n", b"0123456789\n"]
    stream.close()
