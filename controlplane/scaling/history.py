"""The demand history the ramp forecast reads: peak arrival rate per model, region and hour of week, in the store.

Keys (under the store's ``/ferry/``, beside the layout of
:mod:`controlplane.store.base`; written only by the leader):

======================================================  =============================================  =====
key                                                     value                                          lease
======================================================  =============================================  =====
``scaling/history/{model}/{region}/{hour_of_week}``     JSON ``{"day", "peak_rate", "service_seconds"}``  none
                                                        (:class:`controlplane.scaling.plan.HourRecord`)
``scaling/timings/{region}``                            JSON ``{"startup_seconds",``                   none
                                                        ``"replacement_seconds"}`` (null: not measured)
======================================================  =============================================  =====

The key space is bounded: 168 hours of the week per (model, region), at most
``max_series`` pairs (a further pair is not kept, and :meth:`History.observe`
says so), one timings key per region seen. A slot is overwritten a week
later, so a record is at most a week old, and the forecast uses only records
of the previous ``lookback_days`` days (:func:`controlplane.scaling.plan.forecast`).

:class:`History` keeps the records in memory, loaded once from the store
(:meth:`History.load`: a record that does not decode is skipped and counted,
never fatal), raises the current hour's peak on every observation and writes
the records that changed at most every flush (:meth:`History.flush`, one put
each). Names with ``/`` cannot form a key and are not kept. Store errors
(``ferry.errors.Unavailable``) reach the caller, which retries at its next
flush: the records stay marked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from controlplane.scaling.plan import WEEK_HOURS, HourRecord, day_of, hour_of_week
from controlplane.store.base import PREFIX, Store
from ferry.errors import InvalidArgument

SCALING_PREFIX = PREFIX + "scaling/"
HISTORY_PREFIX = SCALING_PREFIX + "history/"
TIMINGS_PREFIX = SCALING_PREFIX + "timings/"

Pair = tuple[str, str]  # (model, region)


def history_key(model: str, region: str, hour: int) -> str:
    """Key of the record of ``model`` in ``region`` for hour of week ``hour``."""
    return f"{HISTORY_PREFIX}{model}/{region}/{hour}"


def timings_key(region: str) -> str:
    """Key of the measured start-up and replacement times of ``region``."""
    return TIMINGS_PREFIX + region


def encode(record: HourRecord) -> bytes:
    """A record as its JSON value."""
    return json.dumps({"day": record.day, "peak_rate": record.peak_rate,
                       "service_seconds": record.service_seconds}).encode()


def _number(body: Mapping[str, object], name: str, *, optional: bool = False) -> float | None:
    value = body.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidArgument(name, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def decode(value: bytes) -> HourRecord:
    """A record from its JSON value; ``InvalidArgument`` naming the field at fault."""
    try:
        body = json.loads(value)
    except ValueError as exc:
        raise InvalidArgument("value", f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("value", "must be a JSON object")
    day = _number(body, "day")
    assert day is not None
    if day != int(day):
        raise InvalidArgument("day", f"must be an integer, got {day!r}")
    return HourRecord(int(day), _number(body, "peak_rate") or 0.0, _number(body, "service_seconds") or 0.0)


def parse_key(key: str) -> tuple[str, str, int] | None:
    """(model, region, hour) of a history key, or None when it is not one."""
    parts = key.removeprefix(HISTORY_PREFIX).split("/")
    if not key.startswith(HISTORY_PREFIX) or len(parts) != 3 or not parts[2].isdigit():
        return None
    hour = int(parts[2])
    return (parts[0], parts[1], hour) if parts[0] and parts[1] and hour < WEEK_HOURS else None


class History:
    """The hour records of every (model, region), mirrored from and written to ``store``.

    Parameters: ``max_series`` (pairs kept). State: the records, the keys changed since the last flush,
    ``skipped`` (records in the store that did not decode, counted at load).
    """

    def __init__(self, store: Store, *, max_series: int = 1024) -> None:
        self.store = store
        self._max_series = max_series
        self._records: dict[Pair, dict[int, HourRecord]] = {}
        self._dirty: set[tuple[str, str, int]] = set()
        self.loaded = False
        self.skipped = 0

    def records(self, model: str, region: str) -> Mapping[int, HourRecord]:
        """Hour of week -> record for the pair (empty when none is kept)."""
        return self._records.get((model, region), {})

    def pairs(self) -> list[Pair]:
        """The (model, region) pairs with records."""
        return sorted(self._records)

    async def load(self) -> None:
        """Read every record and the timings' keys once (the records observed since are kept over them)."""
        listing = await self.store.list(HISTORY_PREFIX)
        for item in listing.items:
            parsed = parse_key(item.key)
            if parsed is None:
                self.skipped += 1
                continue
            model, region, hour = parsed
            try:
                record = decode(item.value)
            except InvalidArgument:
                self.skipped += 1
                continue
            series = self._series(model, region)
            if series is not None and hour not in series:
                series[hour] = record
        self.loaded = True

    async def load_timings(self) -> dict[str, tuple[float | None, float | None]]:
        """Region -> (start-up, replacement) kept in the store; values that do not decode are left out."""
        out: dict[str, tuple[float | None, float | None]] = {}
        for item in (await self.store.list(TIMINGS_PREFIX)).items:
            region = item.key.removeprefix(TIMINGS_PREFIX)
            try:
                body = json.loads(item.value)
                if region and "/" not in region and isinstance(body, dict):
                    out[region] = (_number(body, "startup_seconds", optional=True),
                                   _number(body, "replacement_seconds", optional=True))
            except (ValueError, InvalidArgument):
                self.skipped += 1
        return out

    async def save_timings(self, measured: Mapping[str, tuple[float | None, float | None]]) -> None:
        """Write each region's measured times (one put per region)."""
        for region, (startup, replacement) in sorted(measured.items()):
            if "/" not in region:
                await self.store.put(timings_key(region), json.dumps(
                    {"startup_seconds": startup, "replacement_seconds": replacement}).encode())

    def _series(self, model: str, region: str) -> dict[int, HourRecord] | None:
        pair = (model, region)
        series = self._records.get(pair)
        if series is None:
            if len(self._records) >= self._max_series or not model or not region or "/" in model + region:
                return None
            series = self._records[pair] = {}
        return series

    def observe(self, model: str, region: str, at: float, rate: float, service_seconds: float = 0.0) -> bool:
        """Raise the peak of the hour of unix time ``at`` to ``rate``; False when the pair cannot be kept."""
        series = self._series(model, region)
        if series is None:
            return False
        if not (math.isfinite(rate) and rate >= 0 and math.isfinite(service_seconds) and service_seconds >= 0):
            return True
        hour, day = hour_of_week(at), day_of(at)
        old = series.get(hour)
        if old is None or old.day != day:
            series[hour] = HourRecord(day, rate, service_seconds)
        elif rate > old.peak_rate:
            series[hour] = HourRecord(day, rate, service_seconds or old.service_seconds)
        else:
            return True
        self._dirty.add((model, region, hour))
        return True

    async def flush(self) -> int:
        """Write the records changed since the last flush; returns how many were written."""
        written = 0
        for model, region, hour in sorted(self._dirty):
            record = self._records.get((model, region), {}).get(hour)
            if record is not None:
                await self.store.put(history_key(model, region, hour), encode(record))
            self._dirty.discard((model, region, hour))
            written += 1
        return written
