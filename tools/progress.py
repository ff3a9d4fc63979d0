"""A small progress bar on standard error: redrawn in place on a terminal, a line per 10 % otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    """Counts completed items out of ``total``; ``update`` after each one."""

    def __init__(self, total: int, unit: str) -> None:
        self.total = max(total, 1)
        self.unit = unit
        self.done = 0
        self.errors = 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, *, errors: int = 0) -> None:
        self.done += 1
        self.errors = errors
        now = time.monotonic()
        decile = self.done * 10 // self.total
        if self.tty and (now - self._last_draw > 0.1 or self.done == self.total):
            self._last_draw = now
            sys.stderr.write("\r" + self.line())
            sys.stderr.flush()
        elif not self.tty and decile != self._last_decile:
            self._last_decile = decile
            sys.stderr.write(self.line() + "\n")

    def line(self) -> str:
        width = 30
        filled = int(width * self.done / self.total)
        return (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.unit}"
                f"  errors {self.errors}  {time.monotonic() - self.start:5.1f} s")

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
