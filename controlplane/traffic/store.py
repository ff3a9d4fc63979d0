"""Where the leader keeps the recorded rows: segment files in a directory, or a ring in memory.

**Segments** (:class:`SegmentStore`, ``traffic_dir`` set): JSON Lines files
``traffic-<first write, unix ms>-<n>.jsonl`` (mode 0600) in the directory, one
row a line (:func:`controlplane.traffic.rows.to_json`), and, for rows the
proxies or a relay dropped, a line ``{"dropped": n, "source": …, "at": unix
seconds}``. Rows are appended to the current segment, written and flushed per
report; a new segment starts once the current one holds
``traffic_segment_bytes`` or is ``traffic_segment_seconds`` old, and at
start (the segments of an earlier run are kept and read). After each append,
the oldest segments are deleted while the whole exceeds ``traffic_max_bytes``
and those last written more than ``traffic_max_age_seconds`` ago (the current
segment stays). So the directory holds at most about ``traffic_max_bytes +
traffic_segment_bytes``.

**Memory** (:class:`MemoryStore`, no directory): the last
``traffic_memory_rows`` rows (the oldest evicted first), and rows older than
``traffic_max_age_seconds`` evicted as rows are appended; the drop counts of
the last ``traffic_memory_rows`` appends.

**Reading** (:meth:`reader`): a :class:`Reader` goes over the rows whose
arrival is at least ``since`` (unix seconds), optionally of one model, in the
order they were stored, a chunk of at most ``CHUNK_LINES`` lines at a time:
:meth:`Reader.next_chunk` does file I/O and parsing and is meant to run in a
worker thread (``asyncio.to_thread``), one call at a time. A segment last
written more than ``CLOCK_SKEW_SECONDS`` before ``since`` is not opened
(arrivals are stamped by the proxies' clocks, writes by the leader's). A
segment deleted meanwhile ends early; a line half written, or damaged, is
skipped.

Cost: O(rows) JSON per append (about 10 µs a row), one write and flush per
report; reading O(lines of the segments in the span).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

from controlplane.traffic.rows import from_json, to_json
from ferry.v1 import tables_pb2

CHUNK_LINES = 5000
CLOCK_SKEW_SECONDS = 300.0
SEGMENT = re.compile(r"traffic-(\d{1,17})-(\d{1,6})\.jsonl")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StoreLimits:
    """The store's bounds (``[controlplane] traffic_*``)."""

    segment_bytes: int = 16 * 1024 * 1024
    segment_seconds: float = 3600.0
    max_bytes: int = 1024 * 1024 * 1024
    max_age_seconds: float = 7 * 86400.0
    memory_rows: int = 100_000


@dataclasses.dataclass(slots=True)
class Chunk:
    """What one read step found: rows (in stored order) and rows dropped within the span."""

    rows: list[tables_pb2.TrafficRow]
    dropped: int = 0


class Reader(Protocol):
    """Reads a span of the store a chunk at a time (one call at a time, in a worker thread)."""

    def next_chunk(self) -> Chunk | None:
        """The next chunk; None when the span is read."""


class TrafficStore(Protocol):
    """What the traffic service needs of a store: append, read a span, close."""

    def append(self, rows: Sequence[tables_pb2.TrafficRow], dropped: int, source: str) -> None:
        """Keep ``rows`` (and a count of ``dropped`` rows ``source`` could not send)."""

    def reader(self, since: float, model: str = "") -> Reader:
        """A reader of the rows that arrived at ``since`` or later (of ``model`` when given)."""

    def close(self) -> None:
        """Close the current segment, if any."""


@dataclasses.dataclass(slots=True)
class _Segment:
    """One segment file: its path, first and last write (unix seconds) and size."""

    path: Path
    first: float  # unix seconds of its first write
    last: float  # of its last write
    size: int


class SegmentStore:
    """JSON Lines segments in ``directory``; see the module docstring."""

    def __init__(self, directory: str | Path, limits: StoreLimits, *, wall: Callable[[], float]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.limits = limits
        self._wall = wall
        self._segments: list[_Segment] = []
        for path in self.directory.iterdir():
            found = SEGMENT.fullmatch(path.name)
            if found is None:
                continue
            with contextlib.suppress(OSError):
                stat = path.stat()
                self._segments.append(_Segment(path, int(found.group(1)) / 1000, stat.st_mtime, stat.st_size))
        self._segments.sort(key=lambda s: s.path.name)
        self._file: IO[str] | None = None  # the current segment (the last of _segments), once written to
        self.deleted = 0  # segments deleted by the bounds

    @property
    def bytes(self) -> int:
        """Bytes in all the segments."""
        return sum(s.size for s in self._segments)

    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        return [s.path for s in self._segments]

    def append(self, rows: Sequence[tables_pb2.TrafficRow], dropped: int, source: str) -> None:
        if not rows and not dropped:
            return
        now = self._wall()
        lines = [json.dumps(to_json(row), separators=(",", ":")) for row in rows]
        if dropped:
            lines.append(json.dumps({"dropped": dropped, "source": source, "at": now}, separators=(",", ":")))
        text = "\n".join(lines) + "\n"
        current = self._current(now)
        assert self._file is not None
        self._file.write(text)
        self._file.flush()
        current.last = now
        current.size += len(text.encode())
        self._prune(now)

    def _current(self, now: float) -> _Segment:
        """The segment to write to: a new one at start, past segment_bytes or segment_seconds."""
        last = self._segments[-1] if self._segments else None
        if (self._file is not None and last is not None and last.size < self.limits.segment_bytes
                and now - last.first < self.limits.segment_seconds):
            return last
        self.close()
        n = 0
        while True:
            path = self.directory / f"traffic-{int(now * 1000):015d}-{n:04d}.jsonl"
            if not path.exists():
                break
            n += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        segment = _Segment(path, now, now, 0)
        self._segments.append(segment)
        return segment

    def _prune(self, now: float) -> None:
        """Delete the oldest segments beyond max_bytes, and those older than max_age (never the current one)."""
        total = self.bytes
        while len(self._segments) > 1:
            oldest = self._segments[0]
            if total <= self.limits.max_bytes and now - oldest.last <= self.limits.max_age_seconds:
                break
            with contextlib.suppress(FileNotFoundError):
                oldest.path.unlink()
            total -= oldest.size
            self._segments.pop(0)
            self.deleted += 1

    def reader(self, since: float, model: str = "") -> Reader:
        paths = [s.path for s in self._segments if s.last >= since - CLOCK_SKEW_SECONDS]
        return _FileReader(paths, since, model)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _FileReader:
    """Reads segment files a chunk of lines at a time (run in a worker thread)."""

    def __init__(self, paths: list[Path], since: float, model: str) -> None:
        self._paths = paths
        self._since = since
        self._model = model
        self._offset = 0

    def next_chunk(self) -> Chunk | None:
        while self._paths:
            path = self._paths[0]
            try:
                with path.open("rb") as f:
                    f.seek(self._offset)
                    chunk = Chunk([])
                    for _ in range(CHUNK_LINES):
                        line = f.readline()
                        if not line.endswith(b"\n"):  # the end, or a line being written
                            break
                        self._offset += len(line)
                        self._parse(line, chunk)
                    else:
                        return chunk
            except FileNotFoundError:  # deleted by the bounds meanwhile
                chunk = Chunk([])
            self._paths.pop(0)
            self._offset = 0
            if chunk.rows or chunk.dropped:
                return chunk
        return None

    def _parse(self, line: bytes, chunk: Chunk) -> None:
        try:
            data = json.loads(line)
            if isinstance(data, dict) and "dropped" in data:
                if float(data.get("at", 0.0)) >= self._since:
                    chunk.dropped += int(data["dropped"])
                return
            row = from_json(data)
        except (ValueError, TypeError):
            return  # a damaged line: skipped
        if row.arrival >= self._since and (not self._model or row.model == self._model):
            chunk.rows.append(row)


class MemoryStore:
    """The last ``memory_rows`` rows in memory; see the module docstring."""

    def __init__(self, limits: StoreLimits, *, wall: Callable[[], float]) -> None:
        self.limits = limits
        self._wall = wall
        self._rows: collections.deque[tables_pb2.TrafficRow] = collections.deque(maxlen=limits.memory_rows)
        self._drops: collections.deque[tuple[float, int]] = collections.deque(maxlen=limits.memory_rows)

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, rows: Sequence[tables_pb2.TrafficRow], dropped: int, source: str) -> None:
        now = self._wall()
        self._rows.extend(rows)
        if dropped:
            self._drops.append((now, dropped))
        horizon = now - self.limits.max_age_seconds
        while self._rows and self._rows[0].arrival < horizon:
            self._rows.popleft()
        while self._drops and self._drops[0][0] < horizon:
            self._drops.popleft()

    def reader(self, since: float, model: str = "") -> Reader:
        rows = [r for r in self._rows if r.arrival >= since and (not model or r.model == model)]
        return _ListReader(rows, sum(n for at, n in self._drops if at >= since))

    def close(self) -> None:
        return None


class _ListReader:
    """Reads a snapshot of the memory ring, a chunk at a time; the drops with the first chunk."""

    def __init__(self, rows: list[tables_pb2.TrafficRow], dropped: int) -> None:
        self._rows = rows
        self._dropped = dropped
        self._at = 0

    def next_chunk(self) -> Chunk | None:
        if self._at >= len(self._rows) and not self._dropped:
            return None
        chunk = Chunk(self._rows[self._at:self._at + CHUNK_LINES], self._dropped)
        self._at += CHUNK_LINES
        self._dropped = 0
        return chunk
