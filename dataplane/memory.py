"""Give memory back to the system after bursts of large requests: a collection, then a bounded ``malloc_trim``.

A proxy that received large request bodies (prompts of megabytes, refused or
served) frees them, but glibc's allocator keeps the freed pages in its arenas:
measured, 80 refused 6 MiB prompts took a proxy from 60 MiB to 477 MiB of RSS,
where it stayed while idle. Neither ``MALLOC_ARENA_MAX=2`` nor a fixed
``MALLOC_MMAP_THRESHOLD_`` changed that (423 and 400 MiB), nor did
``malloc_trim(0)`` alone (532 MiB): the refused bodies were still held by
reference cycles (an exception's frames) that the cyclic collector of an idle
process does not visit. A collection, then the trim, gave it back: 74 MiB
(docs/evaluation.md, Slow readers and oversize requests).

:class:`MemoryTrim` runs in the proxy's loop: every ``CHECK_SECONDS`` (1 s)
it reads the process's RSS (``/proc/self/statm``), and when it grew by
``memory_trim_growth_mib`` (``[proxy]``, default 32; 0: off) since the last
trim (or the start), it runs ``gc.collect()`` and then ``malloc_trim(0)`` in
a worker thread (ctypes releases the GIL; the event loop keeps serving) and
takes the RSS after it as the new baseline. A trim during a burst finds the
burst's buffers still in use, so after a growth trim it is *settling*: while
RSS stays ``memory_trim_growth_mib`` above the lowest RSS seen (the floor), it
trims again each second, and stops settling once a trim gives back less than a
quarter of that (nothing more to give) or RSS is back near the floor. So it
trims at most once a second, only after growth and while trims still give
memory back; a steady proxy never trims. Without glibc (no ``malloc_trim``) or
``/proc``, it does nothing.

Cost: one small file read a second; a trim walks the allocator's arenas
(milliseconds for hundreds of MiB), off the loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Callable

from ferry.logs import event

log = logging.getLogger("ferry.proxy")

CHECK_SECONDS = 1.0
MIB = 1 << 20


def rss_bytes() -> int | None:
    """This process's resident set size in bytes (None without ``/proc``)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def glibc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of the C library when it has one (glibc), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def call() -> int:
        return int(trim(0))
    return call


class MemoryTrim:
    """Trims the allocator when RSS grew by ``growth_bytes`` since the last trim; see the module docstring."""

    def __init__(self, growth_bytes: int, *, rss: Callable[[], int | None] = rss_bytes,
                 trim: Callable[[], int] | None = None) -> None:
        self.growth_bytes = growth_bytes
        self._rss = rss
        self._trim = trim if trim is not None else glibc_trim()
        self.baseline = rss() or 0
        self.floor = self.baseline  # the lowest RSS seen: where a burst's memory should go back to
        self.settling = False  # after a growth trim: trim again while it gives memory back
        self.trims = 0

    @property
    def enabled(self) -> bool:
        """Whether it can trim at all (growth above 0, a ``malloc_trim``, an RSS to read)."""
        return self.growth_bytes > 0 and self._trim is not None and self.baseline > 0

    async def check(self) -> bool:
        """Trim when RSS grew past the baseline by ``growth_bytes``, or while settling (module doc); whether it
        trimmed."""
        now = self._rss()
        if now is None or self._trim is None:
            return False
        grew = now - self.baseline >= self.growth_bytes
        settle = self.settling and now - self.floor >= self.growth_bytes
        if not grew and not settle:
            self.settling = self.settling and now - self.floor >= self.growth_bytes
            self.floor = min(self.floor, now)
            if now < self.baseline:
                self.baseline = now  # memory went back by itself: grow from there
            return False
        gc.collect()  # request bodies held by reference cycles (an exception's frames) wait for the cyclic GC
        await asyncio.to_thread(self._trim)
        after = self._rss() or now
        self.trims += 1
        event(log, "memory_trimmed", rss_before_mib=round(now / MIB, 1), rss_after_mib=round(after / MIB, 1))
        self.baseline = after
        self.floor = min(self.floor, after)
        self.settling = grew or now - after >= self.growth_bytes / 4  # settle on while trims give memory back
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Check every ``CHECK_SECONDS`` until ``stop`` is set (no-op when not :attr:`enabled`)."""
        if not self.enabled:
            return
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), CHECK_SECONDS)
            except TimeoutError:
                await self.check()
