"""A log file that rotates by size or at UTC midnight; rotation closes and reopens. Lines reach it in
batches (`gateway.accounting.log.BatchedStream`, every 20 ms and at shutdown), so a batch written just
after midnight may carry the last lines of the day before, and a file may pass `max_bytes` by one batch.

Size: requests.log -> requests.log.1 -> ... -> requests.log.N (the oldest is dropped).
Daily: requests.log -> requests.log.2026-11-21 at the first write after midnight UTC.
`gateway costs` reads all of them, and gzip'd ones too.

`mode` (e.g. 0o600 for files holding prompts: the shadow pairs) is the permission every file of the set is
created with, whatever the umask; an existing file with more permissive bits is narrowed to it when opened.
Rotated files keep it (a rename keeps the mode)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

DAY_S = 86400


class RotatingLogFile:
    def __init__(self, path: Path, *, max_bytes: int | None = None, backups: int = 7, daily: bool = False,
                 mode: int | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.daily = daily
        self.mode = mode
        path.parent.mkdir(parents=True, exist_ok=True)  # `make run` on a fresh clone: .gateway/ is not there yet
        self._file: BinaryIO = self._open()
        self._size = path.stat().st_size
        self._day_ends = _next_midnight(time.time())

    def write(self, data: bytes) -> int:
        if self.daily and time.time() >= self._day_ends:
            self._rotate(f".{datetime.fromtimestamp(self._day_ends - 1, UTC).date().isoformat()}")
        elif self.max_bytes is not None and self._size and self._size + len(data) > self.max_bytes:
            self._rotate(None)
        written = self._file.write(data)
        self._size += written
        return written

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def _rotate(self, dated_suffix: str | None) -> None:
        self._file.close()
        if dated_suffix is not None:
            self.path.rename(self.path.with_name(self.path.name + dated_suffix))
            self._day_ends = _next_midnight(time.time())
        else:
            self._shift()
        self._file, self._size = self._open(), 0

    def _open(self) -> BinaryIO:
        if self.mode is None:
            return self.path.open("ab")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self.mode)  # created with `mode` & ~umask
        os.fchmod(fd, self.mode)  # exactly `mode`: whatever the umask, and for a file made before with more
        return os.fdopen(fd, "ab")

    def _shift(self) -> None:
        oldest = self.path.with_name(f"{self.path.name}.{self.backups}")
        oldest.unlink(missing_ok=True)
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
        self.path.rename(self.path.with_name(f"{self.path.name}.1"))


def _next_midnight(now: float) -> float:
    return (now // DAY_S + 1) * DAY_S
