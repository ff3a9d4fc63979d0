"""A scorer added as one file, outside the product: ``queued``, the replica's queue over its slots.

``queued / max_concurrency`` (the requests waiting in the replica's own
queue, per slot), optionally capped by the parameter ``cap``. It reads a
field the table already carries (:attr:`dataplane.table.pool.Replica.queued`);
importing this module registers it, and ``[proxy.pick]`` names it by type
(tests/dataplane/test_pick_plugins.py).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dataplane.pick.p2c import LocalLoad, Need
from dataplane.pick.plugin import Args, Kind, register
from dataplane.table.pool import Replica


@register
@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """See the module docstring."""

    kind: ClassVar[Kind] = "scorer"
    type_name: ClassVar[str] = "queued"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.queued", "Replica.max_concurrency")
    weight: float = 1.0
    cap: float = float("inf")

    @classmethod
    def build(cls, args: Args) -> Queued:
        args.only("cap")
        return cls(args.weight, args.number("cap", float("inf")))

    def score(self, replica: Replica, need: Need, load: LocalLoad, age: float) -> float:
        return min(replica.queued / replica.max_concurrency, self.cap)
