"""Scorer ``kv``: the share of the replica's KV cache used once the request's blocks are in.

``1 - (kv_blocks_free - need_blocks) / kv_blocks_total``, clamped to
[0, 1]; 0 when the replica reports no KV size. ``need_blocks`` is
``ceil((prompt_tokens + max_tokens) / kv_block_tokens)``. Default weight 0.5
(the ``kv_weight`` of :class:`dataplane.pick.p2c.ScoreParams`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dataplane.pick.p2c import LocalLoad, Need, kv_use
from dataplane.pick.plugin import Args, Kind, register
from dataplane.table.pool import Replica


@register
@dataclasses.dataclass(frozen=True, slots=True)
class Kv:
    """See the module docstring."""

    kind: ClassVar[Kind] = "scorer"
    type_name: ClassVar[str] = "kv"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.kv_blocks_free", "Replica.kv_blocks_total",
                                           "Replica.kv_block_tokens")
    weight: float = 0.5

    @classmethod
    def build(cls, args: Args) -> Kv:
        args.only()
        return cls(args.weight)

    def score(self, replica: Replica, need: Need, load: LocalLoad, age: float) -> float:
        return kv_use(replica, need)
