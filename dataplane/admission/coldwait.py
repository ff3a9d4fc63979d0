"""The edge of cold start for the router: decide at admission, then wait for a table with a ready replica.

:meth:`ColdStarts.allowed` runs the pure decision of :mod:`dataplane.admission.coldstart`
for a request whose version has no ready replica: 0 when the version is not
warming (the pick then answers NoReplica as before), the seconds it may wait
(the expected warm-up fits its tier's queue timeout, ``[proxy]
queue_timeouts``, and its deadline less the admission margin), or
:class:`dataplane.admission.coldstart.WarmingUp` (UNAVAILABLE with ``retry-after``).
:meth:`ColdStarts.wait` then sleeps until each table the proxy applies
(:meth:`ColdStarts.table_applied`, called by the router's one table
listener, pulses an event), lets the router re-resolve the request's
routing on it, and returns as soon as the version has a ready
replica or is no longer warming; when the wait runs out it raises WarmingUp
sized to the warm-up left. Cost: nothing per request that is not a cold
start; O(1) per table applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from dataplane.admission import coldstart
from dataplane.admission.gate import ANSWER_MARGIN
from dataplane.admission.settings import ColdStartSettings
from dataplane.table.local import Table, TableHolder
from dataplane.table.warming import Warming

# Re-resolve the request's routing on a new table: (its version there, whether it has a ready replica).
Reroute = Callable[[Table], tuple[str, bool]]


class ColdStarts:
    """Cold-start decisions and waits for one proxy (module doc)."""

    def __init__(self, settings: ColdStartSettings, holder: TableHolder, clock: Callable[[], float], *,
                 timeouts: Mapping[str, float], floor: float) -> None:
        self._settings = settings
        self._holder = holder
        self._clock = clock
        self._timeouts = dict(timeouts)  # each tier's queue timeout ([proxy] queue_timeouts)
        self._floor = floor  # the least retry-after ([proxy] retry_after_seconds)
        self._applied = asyncio.Event()  # pulsed at every table applied

    def table_applied(self, _table: Table) -> None:
        """A table was applied (the router's listener calls this): wake the waits to look at it."""
        self._applied.set()
        self._applied = asyncio.Event()

    def _refusal(self, model: str, version: str, warming: Warming) -> coldstart.WarmingUp:
        expected = coldstart.expected_ready(warming, self._clock(), floor=self._floor,
                                            warmup_seconds=self._settings.coldstart_warmup_seconds)
        return coldstart.WarmingUp(model, version, warming, expected)

    @staticmethod
    def _warming(table: Table, model: str, version: str) -> Warming | None:
        entry = table.models.get(model)
        return coldstart.find(entry.warming, version) if entry is not None else None

    def allowed(self, table: Table, *, model: str, version: str, tier: str, deadline: float) -> float:
        """Seconds the request may wait for its warming version (0: not warming); raises WarmingUp."""
        warming = self._warming(table, model, version)
        if warming is None:
            return 0.0
        refusal = self._refusal(model, version, warming)
        wait = coldstart.wait_seconds(refusal.retry_after, queue_timeout=self._timeouts[tier],
                                      deadline_left=deadline - self._clock(), margin=ANSWER_MARGIN)
        if wait <= 0:
            raise refusal
        return wait

    async def wait(self, *, model: str, version: str, seconds: float, reroute: Reroute) -> None:
        """Wait at most ``seconds`` for a table in which the version is ready (or no longer warming)."""
        until = self._clock() + seconds
        table = self._holder.table
        while (left := until - self._clock()) > 0:
            applied = self._applied
            try:
                async with asyncio.timeout(left):
                    await applied.wait()
            except TimeoutError:
                break
            table = self._holder.table
            assert table is not None
            version, ready = reroute(table)
            if ready or self._warming(table, model, version) is None:
                return  # ready, or no longer warming: the pick answers
        warming = self._warming(table, model, version) if table is not None else None
        if warming is not None:
            raise self._refusal(model, version, warming)
