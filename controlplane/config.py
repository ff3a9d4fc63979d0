"""Settings of the control plane: the ``[controlplane]`` section of the config file.

Read with ``ferry.config.load_file(path).section(ControlPlaneSettings,
"controlplane")``; the catalog is ``FileConfig.models``. Every field has a
default (docs/CONTRACTS.md: telemetry every 0.5 s, table tick 0.5 s,
membership grace 3 s) and every bound of the control plane is one of these
fields, checked once here so that a bad value fails at load time naming its key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from controlplane.store.etcdaccess import EtcdAccess, load_access
from ferry.errors import ConfigError
from ferry.readiness import DrainTimes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControlPlaneSettings:
    """Timing and bounds of one control plane."""

    id: str = "controlplane"
    # Reserved share of each region's capacity per tier: interactive, standard, batch (controlplane.tables.quotas).
    tier_reserved: tuple[float, ...] = (0.7, 0.2, 0.1)
    # Timing (seconds).
    tick_seconds: float = 0.5  # recompute every table at least this often
    debounce_seconds: float = 0.02  # after a change, wait this long for more before recomputing
    grace_seconds: float = 3.0  # silence (stream gone or telemetry old) after which a node leaves the tables
    telemetry_interval_seconds: float = 0.5  # told to agents in Registered
    forget_after_seconds: float = 300.0  # a dead node is shown to operators this long, then forgotten
    first_message_seconds: float = 10.0  # time a new stream has to send register / subscribe
    store_timeout_seconds: float = 2.0  # deadline of one store call; wait for the store to echo a write of intent
    leader_lease_seconds: float = 3.0  # TTL of a control plane's lease: failover within it plus one tick
    # Under mutual TLS, the name a follower checks its leader's certificate against; empty: the host of the
    # leader's advertised address (set it where leaders are reached by pod IPs no certificate names).
    peer_tls_name: str = ""
    # Bounds.
    max_agents: int = 4096  # agent streams open at once, and nodes remembered
    max_replicas_per_node: int = 64
    # Refuse replicas of models not in [[models]] (an agent then cannot introduce a model). Off by default:
    # adopted Triton endpoints bring models the catalog does not name.
    strict_catalog: bool = False
    max_watchers: int = 1024  # table watch streams open at once
    max_proxies: int = 4096  # proxies remembered for GetTable (disconnected ones are evicted first)
    command_queue_size: int = 64  # commands waiting for one agent
    max_followers: int = 16  # follower control planes streaming to the leader at once
    max_name_bytes: int = 128  # node, replica id, model, proxy id
    max_region_bytes: int = 64
    max_version_bytes: int = 64
    table_history: int = 8  # table versions kept per region for ferryctl table --diff
    max_pending_allocations: int = 256  # allocation requests waiting for a node, fleet-wide
    max_alloc_replicas: int = 64  # replicas one Allocate call may ask for
    max_alloc_gpus: int = 64  # GPUs one replica may ask for
    max_tenants: int = 10_000  # tenants kept in the store (controlplane.tenants.records), pushed in every table
    # Gang allocation (controlplane.allocation.gang.Policy).
    alloc_gang_gpus: int = 8  # a replica of at least this many GPUs may drain small ones
    alloc_replica_weight: float = 10.0  # drain cost of a moved replica, in requests in flight
    alloc_drain_budget: float = 40.0  # drain cost a young large request may impose
    alloc_aging_seconds: float = 30.0  # from this age a large request drains the cheapest node at any cost
    # The Admin API's token: its sha256 in hex (the token itself comes from --admin-token-file or
    # FERRY_ADMIN_TOKEN, see controlplane.api.auth). Without any, every Admin call is refused.
    admin_token_sha256: str = ""
    # The agents' join token: its sha256 in hex (the token itself may come from --join-token-file or
    # FERRY_JOIN_TOKEN, see controlplane.api.join). Without one and without mutual TLS, any agent may join.
    join_token_sha256: str = ""
    # Regions (controlplane.tables.spill): round trips between regions, "a:b" = ms (symmetric); none: no spill.
    region_rtt_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    spill_budget_ms: float = 500.0  # the interactive latency budget a spilled request must still fit
    spill_headroom: float = 0.9  # a region keeps work up to this share of its capacity, takes spill up to it
    spill_service_ms: float = 200.0  # an interactive request's service time, for the budget test
    # Stopping on SIGTERM (ferry.readiness): NOT_SERVING, serve this long more, then give calls in flight the grace.
    drain_delay_seconds: float = 0.0
    drain_grace_seconds: float = 60.0
    # etcd client access (controlplane.store.etcdaccess): TLS files (all three or none), and a user whose
    # password is read from store_password_file or the environment variable FERRY_ETCD_PASSWORD.
    store_tls_ca: str = ""
    store_tls_cert: str = ""
    store_tls_key: str = ""
    store_user: str = ""
    store_password_file: str = ""
    # Recorded traffic (controlplane.traffic): the proxies' sampled rows, kept by the leader.
    traffic_dir: str = ""  # JSON Lines segment files here; empty: a ring of traffic_memory_rows rows in memory
    traffic_segment_bytes: int = 16 * 1024 * 1024  # a new segment once the current one holds this many bytes
    traffic_segment_seconds: float = 3600.0  # ... or is this old
    traffic_max_bytes: int = 1024 * 1024 * 1024  # the oldest segments deleted beyond this many bytes in all
    traffic_max_age_seconds: float = 7 * 86400.0  # segments (and rows in memory) older than this deleted
    traffic_memory_rows: int = 100_000  # the in-memory ring's bound (no traffic_dir)
    traffic_relay_rows: int = 4096  # rows per follower report to the leader
    traffic_relay_bytes: int = 2 << 20  # ... and serialized bytes per report (at least one row)
    traffic_relay_max_rows: int = 100_000  # rows waiting at a follower for the leader; beyond, dropped, counted
    traffic_export_max_rows: int = 1_000_000  # rows one ExportTraffic answers at most

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigError("controlplane.id", "must not be empty")
        if len(self.tier_reserved) != 3 or not all(0 <= v <= 1 for v in self.tier_reserved):
            raise ConfigError("controlplane.tier_reserved", "must be 3 shares in [0, 1] (interactive, standard, batch)")
        positive_floats = (
            "tick_seconds", "grace_seconds", "telemetry_interval_seconds", "forget_after_seconds",
            "first_message_seconds", "store_timeout_seconds", "leader_lease_seconds", "traffic_segment_seconds",
            "traffic_max_age_seconds",
        )
        for key in positive_floats:
            if not getattr(self, key) > 0:
                raise ConfigError(f"controlplane.{key}", "must be > 0")
        if not 0 <= self.debounce_seconds < self.tick_seconds:
            raise ConfigError("controlplane.debounce_seconds", "must be >= 0 and below tick_seconds")
        positive_ints = (
            "max_agents", "max_replicas_per_node", "max_watchers", "max_proxies", "command_queue_size",
            "max_name_bytes", "max_region_bytes", "max_version_bytes", "max_followers", "table_history",
            "max_pending_allocations", "max_alloc_replicas", "max_alloc_gpus", "max_tenants",
            "traffic_segment_bytes", "traffic_max_bytes", "traffic_memory_rows", "traffic_relay_rows",
            "traffic_relay_bytes",
            "traffic_relay_max_rows", "traffic_export_max_rows",
        )
        for key in positive_ints:
            if getattr(self, key) <= 0:
                raise ConfigError(f"controlplane.{key}", "must be > 0")
        if self.max_proxies < self.max_watchers:
            raise ConfigError("controlplane.max_proxies", "must be >= max_watchers")
        self.alloc_policy()  # checks the alloc_* keys
        parse_rtt(self.region_rtt_ms)  # checks region_rtt_ms
        if not 0 < self.spill_headroom <= 1 or not self.spill_budget_ms > 0 or not self.spill_service_ms >= 0:
            raise ConfigError("controlplane.spill_headroom", "need 0 < spill_headroom <= 1, spill_budget_ms > 0, "
                              "spill_service_ms >= 0")
        self.drain()
        tls = {"store_tls_ca": self.store_tls_ca, "store_tls_cert": self.store_tls_cert,
               "store_tls_key": self.store_tls_key}
        if any(tls.values()) and not all(tls.values()):
            missing = min(key for key, path in tls.items() if not path)
            raise ConfigError(f"controlplane.{missing}", "store_tls_ca, store_tls_cert and store_tls_key go together")

    def store_access(self, env: Mapping[str, str] = os.environ) -> EtcdAccess:
        """etcd's client TLS and user from the ``store_*`` keys (files read now; ConfigError naming the key)."""
        return load_access(tls_ca=self.store_tls_ca, tls_cert=self.store_tls_cert, tls_key=self.store_tls_key,
                           user=self.store_user, password_file=self.store_password_file, env=env)

    def drain(self) -> DrainTimes:
        """How the control plane stops on SIGTERM (ConfigError naming ``controlplane.drain_*``)."""
        return DrainTimes.checked(self.drain_delay_seconds, self.drain_grace_seconds, "controlplane")

    def alloc_policy(self) -> Policy:
        """The gang allocator's policy from the ``alloc_*`` keys."""
        return Policy(gang_gpus=self.alloc_gang_gpus, replica_weight=self.alloc_replica_weight,
                      drain_budget=self.alloc_drain_budget, aging_seconds=self.alloc_aging_seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """The allocator's knobs (``[controlplane]`` keys ``alloc_*``)."""

    gang_gpus: int = 8  # a request of at least this many GPUs is large: it may drain small replicas
    replica_weight: float = 10.0  # a moved replica costs as much as this many requests in flight
    drain_budget: float = 40.0  # a young large request drains a node only up to this cost
    aging_seconds: float = 30.0  # from this age on, a large request drains the cheapest node at any cost

    def __post_init__(self) -> None:
        if self.gang_gpus < 1:
            raise ConfigError("controlplane.alloc_gang_gpus", "must be >= 1")
        for key in ("replica_weight", "drain_budget", "aging_seconds"):
            if getattr(self, key) < 0:
                raise ConfigError(f"controlplane.alloc_{key}", "must be >= 0")
    # The planner itself: controlplane.allocation.gang.plan.


def parse_rtt(config: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """``{"a:b": 40}`` to a symmetric map ``{("a", "b"): 40, ("b", "a"): 40}``; raises ConfigError."""
    out: dict[tuple[str, str], float] = {}
    for key, value in config.items():
        a, sep, b = key.partition(":")
        if not sep or not a or not b or a == b:
            raise ConfigError("controlplane.region_rtt_ms", f"key {key!r}: expected 'region:region'")
        if not float(value) >= 0:
            raise ConfigError("controlplane.region_rtt_ms", f"{key}: must be >= 0 ms")
        out[(a, b)] = out[(b, a)] = float(value)
    return out
