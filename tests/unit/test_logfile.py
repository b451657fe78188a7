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
