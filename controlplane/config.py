"""Settings of the control plane: the ``[controlplane]`` section of the config file.

Read with ``ferry.config.load_file(path).section(ControlPlaneSettings,
"controlplane")``; the catalog is ``FileConfig.models``. Every field has a
default (docs/CONTRACTS.md: telemetry every 0.5 s, table tick 0.5 s,
membership grace 3 s) and every bound of the control plane is one of these
fields, checked once here so that a bad value fails at load time naming its key.
"""

from __future__ import annotations

import dataclasses

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControlPlaneSettings:
    """Timing and bounds of one control plane."""

    id: str = "controlplane"
    # Timing (seconds).
    tick_seconds: float = 0.5  # recompute every table at least this often
    debounce_seconds: float = 0.02  # after a change, wait this long for more before recomputing
    grace_seconds: float = 3.0  # silence (stream gone or telemetry old) after which a node leaves the tables
    telemetry_interval_seconds: float = 0.5  # told to agents in Registered
    forget_after_seconds: float = 300.0  # a dead node is shown to operators this long, then forgotten
    first_message_seconds: float = 10.0  # time a new stream has to send register / subscribe
    store_timeout_seconds: float = 2.0  # deadline of one store call; wait for the store to echo a write of intent
    leader_lease_seconds: float = 3.0  # TTL of a control plane's lease: failover within it plus one tick
    # Bounds.
    max_agents: int = 4096  # agent streams open at once, and nodes remembered
    max_replicas_per_node: int = 64
    max_watchers: int = 1024  # table watch streams open at once
    max_proxies: int = 4096  # proxies remembered for GetTable (disconnected ones are evicted first)
    command_queue_size: int = 64  # commands waiting for one agent
    max_followers: int = 16  # follower control planes streaming to the leader at once
    max_name_bytes: int = 128  # node, replica id, model, proxy id
    max_region_bytes: int = 64
    max_version_bytes: int = 64

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigError("controlplane.id", "must not be empty")
        positive_floats = (
            "tick_seconds", "grace_seconds", "telemetry_interval_seconds", "forget_after_seconds",
            "first_message_seconds", "store_timeout_seconds", "leader_lease_seconds",
        )
        for key in positive_floats:
            if not getattr(self, key) > 0:
                raise ConfigError(f"controlplane.{key}", "must be > 0")
        if not 0 <= self.debounce_seconds < self.tick_seconds:
            raise ConfigError("controlplane.debounce_seconds", "must be >= 0 and below tick_seconds")
        positive_ints = (
            "max_agents", "max_replicas_per_node", "max_watchers", "max_proxies", "command_queue_size",
            "max_name_bytes", "max_region_bytes", "max_version_bytes", "max_followers",
        )
        for key in positive_ints:
            if getattr(self, key) <= 0:
                raise ConfigError(f"controlplane.{key}", "must be > 0")
        if self.max_proxies < self.max_watchers:
            raise ConfigError("controlplane.max_proxies", "must be >= max_watchers")
