"""The regions' part of the ``[proxy]`` section: spill to other regions.

Composed into :class:`dataplane.config.ProxySettings` (``regions``); checked here (ConfigError naming
``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegionSettings:
    """Spill to other regions (:mod:`dataplane.regions.choice`, the region step) and the simulated round trip."""

    spill_queue_ms: float = 100.0  # spill on queue when the local wait would exceed this and the rtt (regions.choice)
    spill_headroom: float = 1.25  # a spill target's slots x this: what spills may fill there (as this proxy sees)
    simulate_region_rtt: bool = False  # sleep a spill target's rtt_ms before a cross-region forward (one machine)

    def __post_init__(self) -> None:
        if not self.spill_queue_ms >= 0 or not 0 < self.spill_headroom <= 4:
            raise ConfigError("proxy.spill_queue_ms", "need spill_queue_ms >= 0 and 0 < spill_headroom <= 4")
