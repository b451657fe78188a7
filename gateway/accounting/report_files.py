"""Writing a report's output files (CSV, PNG) from a command: one failure is reported, never raised."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def write_output(command: str, path: Path, write: Callable[[], None], out: TextIO, *, lead: str = "") -> int:
    """Run one output writer; 0 and "Wrote PATH" on `out`, or 1 and the reason on stderr (named by `command`)."""
    try:
        write()
    except OSError as exc:
        print(f"{command}: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{lead}Wrote {path}", file=out)
    return 0
