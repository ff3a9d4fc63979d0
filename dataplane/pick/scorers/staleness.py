"""Scorer ``staleness``: how old the replica's telemetry is, from 0 (fresh) to 1 (stale).

``(age - fresh_seconds) / (stale_seconds - fresh_seconds)``, clamped to
[0, 1]; ``age`` is the pushed telemetry's age plus the time since the table
was applied. Parameters ``fresh_seconds`` and ``stale_seconds`` (default the
``telemetry_fresh_seconds`` and ``telemetry_stale_seconds`` keys, 1 and 6 s).
Default weight 1 (the ``stale_weight`` of :class:`dataplane.pick.p2c.ScoreParams`):
stale telemetry counts as one full replica of load.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dataplane.pick.p2c import LocalLoad, Need, staleness
from dataplane.pick.plugin import Args, Kind, register
from dataplane.table.pool import Replica
from ferry.errors import ConfigError


@register
@dataclasses.dataclass(frozen=True, slots=True)
class Staleness:
    """See the module docstring."""

    kind: ClassVar[Kind] = "scorer"
    type_name: ClassVar[str] = "staleness"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.telemetry_age",)
    weight: float = 1.0
    fresh_seconds: float = 1.0
    stale_seconds: float = 6.0

    @classmethod
    def build(cls, args: Args) -> Staleness:
        args.only("fresh_seconds", "stale_seconds")
        fresh = args.number("fresh_seconds", args.pick.telemetry_fresh_seconds)
        stale = args.number("stale_seconds", args.pick.telemetry_stale_seconds)
        if not 0 <= fresh < stale:
            raise ConfigError(f"{args.where}.params.stale_seconds", "must exceed fresh_seconds (>= 0)")
        return cls(args.weight, fresh, stale)

    def score(self, replica: Replica, need: Need, load: LocalLoad, age: float) -> float:
        return staleness(age, self.fresh_seconds, self.stale_seconds)
