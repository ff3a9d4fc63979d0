"""Scorer ``load``: the share of the replica's slots taken, this proxy's in-flight requests included.

``(max(queued + running - counted, 0) x trust + inflight) / max_concurrency``
(:func:`dataplane.table.pool.occupancy`): ``counted`` is the part of this
proxy's in-flight the pushed load already includes, ``trust`` the share of
the pushed load still standing at the telemetry's age
(:class:`dataplane.pick.p2c.LocalLoad`). Default weight 1.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dataplane.pick.p2c import LocalLoad, Need
from dataplane.pick.plugin import Args, Kind, register
from dataplane.table.pool import Replica, occupancy


@register
@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """See the module docstring."""

    kind: ClassVar[Kind] = "scorer"
    type_name: ClassVar[str] = "load"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.queued", "Replica.running", "Replica.max_concurrency",
                                           "proxy: in-flight per replica")
    weight: float = 1.0

    @classmethod
    def build(cls, args: Args) -> Load:
        args.only()
        return cls(args.weight)

    def score(self, replica: Replica, need: Need, load: LocalLoad, age: float) -> float:
        rid = replica.replica_id
        return occupancy(replica, load.get(rid), load.counted.get(rid, 0), load.trust(age))
