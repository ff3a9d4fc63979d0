"""The admission's part of the ``[proxy]`` section: the tier queues and the cold-start wait.

Composed into :class:`dataplane.config.ProxySettings` (``queues``, ``coldstart``); the defaults and what
each key does are told in :mod:`dataplane.config`'s docstring. Each class checks its own keys
(ConfigError naming ``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from dataplane.admission.queues import QueueParams
from ferry.config import TIERS, positive
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueSettings:
    """The tier queues' settings (:mod:`dataplane.admission.queues`, ``.gate``), per tier in TIERS order."""

    admission: bool = True
    admission_capacity_share: float = 1.0   # share of the fleet's concurrency this proxy dispatches
    queue_bounds: tuple[int, ...] = (256, 512, 4096)
    queue_timeouts: tuple[float, ...] = (2.0, 10.0, 60.0)
    queue_max_total: int = 8192
    tier_reserved: tuple[float, ...] = (0.7, 0.2, 0.1)
    free_queue_share: float = 0.5
    fair_quantum_tokens: int = 512
    interactive_headroom_seconds: float = 0.2  # lower tiers leave interactive rate x this many slots free
    interactive_headroom_max_share: float = 0.1  # ... at most this share of the slots
    tenant_ceiling: float = 1.0  # a tenant runs at most this x its weighted share of its tier (0: no ceiling)
    tenant_shard_max_share: float = 0.5  # heavy tenants' shards cover at most this share of the replicas (0: off)
    tenant_shard_hold_seconds: float = 1.0  # a tenant stays confined this long after it was last seen heavy
    interactive_replica_share: float = 0.0  # this share of each model's replicas runs interactive only (0: off)
    tenant_metric_labels: int = 100  # tenants named in the per-tenant admission metrics; the rest are "_other"

    def __post_init__(self) -> None:
        positive("proxy", {"tenant_metric_labels": self.tenant_metric_labels})
        for key, tiered in (("queue_bounds", self.queue_bounds), ("queue_timeouts", self.queue_timeouts),
                            ("tier_reserved", self.tier_reserved)):
            if len(tiered) != len(TIERS) or not all(v >= 0 for v in tiered):
                raise ConfigError(f"proxy.{key}", f"must be {len(TIERS)} values >= 0 ({', '.join(TIERS)})")
        for key, share in (("interactive_headroom_seconds", self.interactive_headroom_seconds),
                           ("interactive_headroom_max_share", self.interactive_headroom_max_share),
                           ("tenant_ceiling", self.tenant_ceiling),
                           ("tenant_shard_max_share", self.tenant_shard_max_share),
                           ("tenant_shard_hold_seconds", self.tenant_shard_hold_seconds),
                           ("interactive_replica_share", self.interactive_replica_share)):
            if not share >= 0 or (key.endswith("share") and share > 1):  # also rejects NaN
                raise ConfigError(f"proxy.{key}", "must be >= 0" + (" and <= 1" if key.endswith("share") else ""))
        if not 0 < self.admission_capacity_share <= 1 or not 0 < self.free_queue_share <= 1:
            raise ConfigError("proxy.admission_capacity_share", "shares must be in (0, 1]")

    def timeouts(self) -> dict[str, float]:
        """Queue timeout per tier."""
        return dict(zip(TIERS, self.queue_timeouts, strict=True))

    def queue_params(self) -> QueueParams:
        """What the tier queues need of these settings."""
        return QueueParams(bounds=dict(zip(TIERS, self.queue_bounds, strict=True)),
                           timeouts=self.timeouts(),
                           max_queued=self.queue_max_total, free_share=self.free_queue_share,
                           quantum=self.fair_quantum_tokens, headroom_seconds=self.interactive_headroom_seconds,
                           headroom_max_share=self.interactive_headroom_max_share, tenant_ceiling=self.tenant_ceiling,
                           shard_max_share=self.tenant_shard_max_share,
                           shard_hold_seconds=self.tenant_shard_hold_seconds,
                           interactive_replica_share=self.interactive_replica_share,
                           reserved=dict(zip(TIERS, self.tier_reserved, strict=True)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ColdStartSettings:
    """Cold start's settings (:class:`dataplane.admission.coldwait.ColdStarts`)."""

    coldstart_warmup_seconds: float = 30.0  # expected warm-up of a replica: sizes a cold start's retry-after

    def __post_init__(self) -> None:
        positive("proxy", {"coldstart_warmup_seconds": self.coldstart_warmup_seconds})
