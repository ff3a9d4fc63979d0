"""The decision's built-in filters (:mod:`dataplane.pick.plugin`), one class each, registered by type name.

=============== ======= ===================================================================
type            stage   takes out
=============== ======= ===================================================================
``tried``       hard    replicas that already failed this request (``Ask.tried``)
``ejected``     soft    replicas ejected by outlier detection or refused (``Local.ejected``)
``avoid``       soft    the tier queues' shards and full replicas (``Ask.avoid``)
``tried_nodes`` soft    replicas on the nodes of the replicas that failed (``Ask.tried_nodes``)
``room``        taker   a replica without the free KV blocks for the request (:func:`dataplane.pick.p2c.fits`)
``fresh``       taker   a replica whose telemetry is ``stale_seconds`` old or older
                        (parameter; default ``telemetry_stale_seconds``)
=============== ======= ===================================================================

Soft filters give way last listed first when nothing else is left (default
order: ``ejected``, ``avoid``, ``tried_nodes``): an ejected replica beats none.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from dataplane.pick.p2c import Need, fits
from dataplane.pick.plugin import NOTHING, Args, Kind, Stage, register
from dataplane.table.pool import Replica

if TYPE_CHECKING:
    from dataplane.pick.decide import Ask, Local


class _IdFilter:
    """A filter that takes nothing out per replica: its ``off`` set is all it says."""

    kind: ClassVar[Kind] = "filter"
    type_name: ClassVar[str]
    consumes: ClassVar[tuple[str, ...]]
    stage: Stage

    @classmethod
    def build(cls, args: Args) -> _IdFilter:
        return cls()

    def takes(self, replica: Replica, need: Need, age: float) -> bool:
        return True


@register
class Tried(_IdFilter):
    """Replicas that already failed this request: out for good (hard)."""

    type_name = "tried"
    consumes = ("request: replicas tried",)
    stage: Stage = "hard"

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        return ask.tried, NOTHING


@register
class Ejected(_IdFilter):
    """Replicas outlier detection ejected or that refused a connection (soft: one beats none)."""

    type_name = "ejected"
    consumes = ("proxy: outlier ejections, refused connections",)
    stage: Stage = "soft"

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        return local.ejected, NOTHING


@register
class Avoid(_IdFilter):
    """The tier queues' avoid set: heavy tenants' shards, interactive-only and full replicas (soft)."""

    type_name = "avoid"
    consumes = ("proxy: tier queues' avoid set",)
    stage: Stage = "soft"

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        return ask.avoid, NOTHING


@register
class TriedNodes(_IdFilter):
    """Replicas on the nodes of the replicas that failed this request (soft: gives way first by default)."""

    type_name = "tried_nodes"
    consumes = ("Replica.node", "request: nodes tried")
    stage: Stage = "soft"

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        return NOTHING, ask.tried_nodes


class _Taker:
    """A filter checked where a replica takes a prefix key (the remembered replica, the ring walk)."""

    kind: ClassVar[Kind] = "filter"
    type_name: ClassVar[str]
    consumes: ClassVar[tuple[str, ...]]
    stage: Stage = "taker"

    def off(self, ask: Ask, local: Local) -> tuple[frozenset[str], frozenset[str]]:
        return NOTHING, NOTHING


@register
class Room(_Taker):
    """The replica reports the free KV blocks the request needs (or reports none)."""

    type_name = "room"
    consumes = ("Replica.kv_blocks_free", "Replica.kv_blocks_total", "Replica.kv_block_tokens")

    @classmethod
    def build(cls, args: Args) -> Room:
        return cls()

    def takes(self, replica: Replica, need: Need, age: float) -> bool:
        return fits(replica, need)


@register
@dataclasses.dataclass(frozen=True, slots=True)
class Fresh(_Taker):
    """The replica's telemetry is younger than ``stale_seconds``."""

    type_name: ClassVar[str] = "fresh"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.telemetry_age",)
    stale_seconds: float = 6.0

    @classmethod
    def build(cls, args: Args) -> Fresh:
        return cls(args.pick.telemetry_stale_seconds)

    def takes(self, replica: Replica, need: Need, age: float) -> bool:
        return age < self.stale_seconds
