"""The agent's settings, read from the ``[agent]`` section of the config file.

| key | default | meaning |
| --- | --- | --- |
| ``telemetry_interval_seconds`` | 0.5 | how often telemetry is sent and replicas polled (see below) |
| ``backoff_initial_seconds`` | 0.1 | first reconnection delay, doubled per failure |
| ``backoff_max_seconds`` | 5.0 | cap of the reconnection delay |
| ``probe_timeout_seconds`` | 1.0 | timeout of each call to a replica endpoint |
| ``discovery_interval_seconds`` | 5.0 | how often an adopted Triton endpoint's models are listed again |
| ``max_replicas`` | 256 | replicas one agent tracks at most; more discovered models are ignored with a warning |
| ``max_pending_results`` | 256 | command results waiting to be sent; beyond, the stream is dropped and re-opened |
| ``default_max_concurrency`` | 16 | concurrency target of an adopted model with ``max_batch_size`` 0 |

The telemetry interval is clamped to 0.25–1.0 s, and replaced by the interval
the control plane's ``Registered`` gives, when it gives one.
"""

from __future__ import annotations

import dataclasses

from ferry.errors import ConfigError

TELEMETRY_MIN_SECONDS = 0.25
TELEMETRY_MAX_SECONDS = 1.0


def clamp_interval(seconds: float) -> float:
    """A telemetry interval within 0.25–1.0 s."""
    return min(TELEMETRY_MAX_SECONDS, max(TELEMETRY_MIN_SECONDS, seconds))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Timing and bounds of one node's agent."""

    telemetry_interval_seconds: float = 0.5
    backoff_initial_seconds: float = 0.1
    backoff_max_seconds: float = 5.0
    probe_timeout_seconds: float = 1.0
    discovery_interval_seconds: float = 5.0
    max_replicas: int = 256
    max_pending_results: int = 256
    default_max_concurrency: int = 16

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ConfigError(f"agent.{f.name}", f"must be > 0, got {getattr(self, f.name)}")
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ConfigError("agent.backoff_max_seconds", "must be >= backoff_initial_seconds")
