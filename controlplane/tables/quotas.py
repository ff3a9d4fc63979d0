"""Tier quotas of each region's table: reserved shares, lending and reclaim (pure).

:func:`region_quotas` applies :func:`ferry.quotas.compute_quotas` (the same
function every proxy runs at dispatch) to a region: capacity is the sum of
the concurrency targets (``max_concurrency``) of the replicas in its table,
demand per tier what the control plane knows of it (``demand``; a tier with
no reported demand is counted as wanting the whole capacity, so the table
states each tier's protected reserve and lends only what is known to be idle).
:func:`attach_quotas` writes the result into each snapshot's ``tier_quotas``
(in priority order), so a change of reserve or capacity is a new table
version pushed within the tick (0.5 s). Reserved shares default to
interactive 0.7, standard 0.2, batch 0.1.

Algorithm of lending and reclaim: see :mod:`ferry.quotas` (guarantee the
reserve up to demand, higher tiers borrow first, batch takes what is idle).

Cost: O(replicas) per region.
"""

from __future__ import annotations

from collections.abc import Mapping

from ferry.config import TIERS
from ferry.quotas import DEFAULT_RESERVED, Quotas, compute_quotas
from ferry.v1 import tables_pb2

__all__ = ["attach_quotas", "compute_quotas", "region_capacity", "region_quotas"]


def region_capacity(snapshot: tables_pb2.TableSnapshot) -> int:
    """Concurrency slots of the region: the sum of its replicas' targets."""
    return sum(r.max_concurrency for m in snapshot.models for r in m.replicas)


def region_quotas(snapshot: tables_pb2.TableSnapshot, demand: Mapping[str, int] | None = None,
                  shares: Mapping[str, float] = DEFAULT_RESERVED) -> Quotas:
    """The region's quotas for ``demand`` (None or a missing tier: the whole capacity)."""
    capacity = region_capacity(snapshot)
    known = demand or {}
    return compute_quotas(capacity, {t: known.get(t, capacity) for t in TIERS}, shares)


def attach_quotas(tables: Mapping[str, tables_pb2.TableSnapshot],
                  demand: Mapping[str, Mapping[str, int]] | None = None,
                  shares: Mapping[str, float] = DEFAULT_RESERVED) -> dict[str, Quotas]:
    """Fill ``tier_quotas`` of every snapshot in place; returns the quotas by region."""
    out: dict[str, Quotas] = {}
    total = sum(max(shares.get(t, 0.0), 0.0) for t in TIERS) or 1.0
    for region, snapshot in tables.items():
        quotas = out[region] = region_quotas(snapshot, (demand or {}).get(region), shares)
        del snapshot.tier_quotas[:]
        for tier in TIERS:
            snapshot.tier_quotas.append(tables_pb2.TierQuota(
                tier=tier, reserved_share=max(shares.get(tier, 0.0), 0.0) / total,
                reserved_slots=quotas.reserved[tier], quota_slots=quotas.quota[tier], lent_slots=quotas.lent[tier]))
    return out
