"""The cache's part of the ``[proxy]`` section: the duplicate measurement and the response cache.

Composed into :class:`dataplane.config.ProxySettings` (``cache``); checked here (ConfigError naming
``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from dataplane.cache.decide import MODES as CACHE_MODES
from dataplane.cache.decide import CachePolicy
from ferry.config import at_least_zero, positive
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """The duplicate measurement and the response cache (:mod:`dataplane.cache`).

    Measured: deterministic requests (temperature 0 or a seed) over a sliding
    window of ``cache_window_seconds`` (600 s), in a set of at most
    ``cache_sketch_hashes`` (65,536) payload hashes and ``cache_max_rows``
    (1,024) (model, tenant) rows. Decided per model (``cache_mode`` ``auto``;
    ``off`` measures only): on when the duplicate share exceeds
    ``cache_enable_above`` (0.05), off again below ``cache_disable_below``
    (0.03), with at least ``cache_min_requests`` (200) deterministic requests
    in the window. The cache: at most ``cache_max_entries`` (10,000) answers
    and ``cache_max_bytes`` (64 MiB), each kept ``cache_ttl_seconds`` (300 s).
    """

    cache_mode: str = "auto"
    cache_enable_above: float = 0.05
    cache_disable_below: float = 0.03
    cache_min_requests: int = 200
    cache_window_seconds: float = 600.0
    cache_sketch_hashes: int = 65_536
    cache_max_rows: int = 1024
    cache_max_entries: int = 10_000
    cache_max_bytes: int = 64 * 1024 * 1024
    cache_ttl_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.cache_mode not in CACHE_MODES:
            raise ConfigError("proxy.cache_mode", f"must be one of {', '.join(CACHE_MODES)}")
        for key in ("cache_enable_above", "cache_disable_below"):
            value = getattr(self, key)
            if not 0 <= value <= 1:
                raise ConfigError(f"proxy.{key}", "must be 0..1")
        if self.cache_disable_below > self.cache_enable_above:
            raise ConfigError("proxy.cache_disable_below", "must be at most cache_enable_above")
        at_least_zero("proxy", {"cache_min_requests": self.cache_min_requests})
        positive("proxy", {"cache_window_seconds": self.cache_window_seconds,
                           "cache_sketch_hashes": self.cache_sketch_hashes, "cache_max_rows": self.cache_max_rows,
                           "cache_max_entries": self.cache_max_entries,
                           "cache_max_bytes": self.cache_max_bytes, "cache_ttl_seconds": self.cache_ttl_seconds})
        if self.cache_window_seconds > 86_400:
            raise ConfigError("proxy.cache_window_seconds", "must be at most 86400")
        if self.cache_sketch_hashes > 16_777_216:
            raise ConfigError("proxy.cache_sketch_hashes", "must be at most 16777216")

    def policy(self) -> CachePolicy:
        """The on/off thresholds (:func:`dataplane.cache.decide.decide`)."""
        return CachePolicy(enable_above=self.cache_enable_above, disable_below=self.cache_disable_below,
                           min_requests=self.cache_min_requests, mode=self.cache_mode)
