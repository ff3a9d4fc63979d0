"""The other regions a proxy may spill to, as its table gives them, and the pick of a replica there.

:func:`remote_view` turns a table's ``spill`` routes (the control plane's
:mod:`controlplane.tables.spill`) into :class:`RemoteView`: the targets in order
(:class:`dataplane.regions.choice.SpillTarget`: region, weight, round trip, batch
weight, whether the route is for batch alone) and, per
(region, model), the ready replicas there, serving the route's default
version. Routes that are malformed (wrong region, empty id or address) are
skipped: spill is an optimisation, never a reason to reject a table. The
caller builds the view once per table it applies
(:func:`dataplane.pick.decide.make_view`).

:func:`pick_remote`: power of two choices among a remote region's replicas
on :func:`dataplane.table.pool.occupancy`, (queued + running in the table -
``counted`` + this proxy's in-flight to it) / max_concurrency, ``counted`` being the in-flight the pushed load
already includes (:meth:`dataplane.pick.p2c.LocalLoad.mark`) and the pushed
load weighed by how much of it still stands at its age
(:meth:`dataplane.pick.p2c.LocalLoad.trust`), as the local pick does; no
prefix affinity across regions (the remote caches are not this region's).
:meth:`RemoteView.rooms`: per usable region, the requests this proxy may
still send there (:func:`dataplane.regions.choice.room` on the region's slots, its
load in the table and this proxy's in-flight to its replicas), for the
spill on queue.
Pure: the random generator is an argument. Cost: O(1) per pick; the view
O(spilled replicas) once per table.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping

from dataplane.regions.choice import DEFAULT_HEADROOM, SpillTarget, room
from dataplane.table.local import Table
from dataplane.table.pool import Replica, load, occupancy


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteView:
    """Spill targets in the table's order and their replicas per (region, model)."""

    targets: tuple[SpillTarget, ...] = ()
    replicas: Mapping[tuple[str, str], tuple[Replica, ...]] = dataclasses.field(default_factory=dict)

    def usable(self, model: str) -> frozenset[str]:
        """Regions with at least one replica of ``model``."""
        return frozenset(region for (region, m), rs in self.replicas.items() if m == model and rs)

    def rooms(self, model: str, inflight: Mapping[str, int], counted: Mapping[str, int], *,
              headroom: float = DEFAULT_HEADROOM, share: float = 1.0) -> dict[str, float]:
        """Region -> requests of ``model`` this proxy may still send there (:func:`dataplane.regions.choice.room`)."""
        out: dict[str, float] = {}
        for (region, m), replicas in self.replicas.items():
            if m == model and replicas:
                out[region] = room(sum(r.max_concurrency for r in replicas),
                                   sum(load(r, counted.get(r.replica_id, 0)) for r in replicas),
                                   sum(inflight.get(r.replica_id, 0) for r in replicas), headroom=headroom, share=share)
        return out


EMPTY = RemoteView()


def remote_view(table: Table) -> RemoteView:
    """The table's spill routes as a :class:`RemoteView` (see the module docstring)."""
    if not table.spill:
        return EMPTY
    targets: list[SpillTarget] = []
    replicas: dict[tuple[str, str], tuple[Replica, ...]] = {}
    for route in table.spill:
        if not route.region or route.region == table.region or not 0 <= route.weight <= 1 \
                or not 0 <= route.batch_weight <= 1:
            continue
        targets.append(SpillTarget(route.region, 0.0 if route.batch_only else route.weight, max(0.0, route.rtt_ms),
                                   batch_weight=route.batch_weight, batch_only=route.batch_only))
        for model in route.models:
            replicas[(route.region, model.model)] = tuple(
                Replica(replica_id=r.replica_id, address=r.address, kserve_model=r.kserve_model or model.model,
                        version=r.version, node=r.node, http_address=r.http_address, engine=r.engine,
                        max_concurrency=max(1, r.max_concurrency),
                        queued=r.load.queued, running=r.load.running, telemetry_age=r.telemetry_age_seconds)
                for r in model.replicas
                if r.replica_id and (r.address or r.http_address) and r.region == route.region
                and (not model.default_version or r.version == model.default_version))
    return RemoteView(tuple(targets), replicas)


def pick_remote(replicas: tuple[Replica, ...], inflight: Mapping[str, int], rng: random.Random,
                excluded: frozenset[str] | set[str] = frozenset(), *,
                counted: Mapping[str, int] | None = None, trust: Callable[[float], float] | None = None,
                table_age: float = 0.0) -> Replica | None:
    """Power of two choices on relative load among ``replicas`` not in ``excluded``; None when none is left."""
    left = [r for r in replicas if r.replica_id not in excluded]
    if not left:
        return None
    if len(left) == 1:
        return left[0]
    a, b = rng.sample(left, 2)

    def score(r: Replica) -> float:
        return occupancy(r, inflight.get(r.replica_id, 0), counted.get(r.replica_id, 0) if counted else 0,
                         trust(r.telemetry_age + table_age) if trust else 1.0)

    return a if score(a) <= score(b) else b
