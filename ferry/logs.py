"""Structured logs: one JSON line per record, and events with a name and typed fields.

Every component logs to standard error through :func:`configure`. In the
default ``json`` format each record is one JSON object on one line with
``ts`` (unix seconds), ``level``, ``logger`` and either the event's fields
(a record made by :func:`event`) or ``msg`` (any other record), so a log
pipeline needs no parser of its own; ``text`` is the classic
``time level logger: message`` line for a terminal.

:func:`event` names a notable event (``request_failed``, ``stream_continued``,
``replica_ejected``, ``table_applied``, ``leader_elected``, …) with its
fields; the message itself is the JSON object, so the same line reads well
in either format and a test can parse ``record.getMessage()``.

Bounded: each event name has a token bucket (``burst`` lines, refilled at
``rate`` per second, defaults 50 and 20): past it lines are dropped and
counted, and the next line of that name carries ``suppressed`` with the
count, so an overload that sheds thousands of requests a second logs a few
dozen lines a second and says how many it left out. Cost: O(fields) per
line; state O(event names).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: ``ts``, ``level``, ``logger``, then the event's fields or ``msg``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname, "logger": record.name}
        fields = _object(message)
        if fields is None:
            line["msg"] = message
        else:
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, sort_keys=False, default=str)


def _object(message: str) -> dict[str, Any] | None:
    if not message.startswith("{"):
        return None
    try:
        value = json.loads(message)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def configure(level: str | int = logging.INFO, fmt: str = "json") -> None:
    """Send every record to standard error in ``fmt`` (``json`` or ``text``)."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format: must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


class _Bucket:
    """One token bucket of the log rate limit: tokens left, when last refilled, and records suppressed."""

    __slots__ = ("stamp", "suppressed", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.suppressed = 0


class EventLimiter:
    """Per event name token bucket: ``burst`` lines at once, ``rate`` per second after."""

    def __init__(self, *, burst: float = 50.0, rate: float = 20.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate = rate
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def admit(self, name: str) -> int | None:
        """None: drop this line (counted); else the number of lines of ``name`` dropped since the last one."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._buckets[name] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                bucket.suppressed += 1
                return None
            bucket.tokens -= 1.0
            dropped, bucket.suppressed = bucket.suppressed, 0
            return dropped


LIMITER = EventLimiter()


def event(logger: logging.Logger, name: str, level: int = logging.INFO, *,
          limiter: EventLimiter | None = None, **fields: Any) -> None:
    """Log the event ``name`` with ``fields`` as one JSON object (rate-limited per name)."""
    if not logger.isEnabledFor(level):
        return
    dropped = (limiter or LIMITER).admit(name)
    if dropped is None:
        return
    body: dict[str, Any] = {"event": name, **fields}
    if dropped:
        body["suppressed"] = dropped
    logger.log(level, json.dumps(body, sort_keys=True, default=str))


def add_argument(parser: Any) -> None:
    """The ``--log-format`` option every component takes."""
    parser.add_argument("--log-format", choices=FORMATS, default="json",
                        help="json: one JSON object a line (default); text: for a terminal")
