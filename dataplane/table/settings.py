"""The table's part of the ``[proxy]`` section: the table holder's bounds and ring, and the table watch.

Composed into :class:`dataplane.config.ProxySettings` (``table``, ``watch``); checked here (ConfigError
naming ``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from dataplane.table.local import MAX_VNODES, TableParams
from dataplane.table.ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES
from ferry.config import positive
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableSettings:
    """The table holder's bounds and ring defaults (:class:`dataplane.table.local.TableParams`)."""

    max_table_replicas: int = 100_000
    max_table_models: int = 10_000
    load_factor: float = DEFAULT_LOAD_FACTOR
    ring_vnodes: int = DEFAULT_VNODES
    load_smoothing_seconds: float = 10.0

    def __post_init__(self) -> None:
        positive("proxy", {"max_table_replicas": self.max_table_replicas, "max_table_models": self.max_table_models,
                           "load_smoothing_seconds": self.load_smoothing_seconds})
        if not self.load_factor > 1.0:
            raise ConfigError("proxy.load_factor", "must be above 1")
        if not 0 < self.ring_vnodes <= MAX_VNODES:
            raise ConfigError("proxy.ring_vnodes", f"must be 1..{MAX_VNODES}")

    def table_params(self) -> TableParams:
        """What the table holder needs of these settings."""
        return TableParams(max_models=self.max_table_models, max_replicas=self.max_table_replicas,
                           load_factor=self.load_factor, vnodes=self.ring_vnodes,
                           smoothing_seconds=self.load_smoothing_seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchSettings:
    """The table watch (:class:`dataplane.table.watch.TableWatcher`) and the usage reports it carries."""

    table_stale_warn_seconds: float = 10.0
    reconnect_initial_seconds: float = 0.1
    reconnect_max_seconds: float = 5.0
    usage_report_seconds: float = 1.0  # a usage report on the table watch this often (dataplane.usage); 0: none
    usage_max_rows: int = 1024  # (model, tier) rows per report

    def __post_init__(self) -> None:
        positive("proxy", {"table_stale_warn_seconds": self.table_stale_warn_seconds,
                           "reconnect_initial_seconds": self.reconnect_initial_seconds,
                           "reconnect_max_seconds": self.reconnect_max_seconds, "usage_max_rows": self.usage_max_rows})
        if self.reconnect_max_seconds < self.reconnect_initial_seconds:
            raise ConfigError("proxy.reconnect_max_seconds", "must be at least reconnect_initial_seconds")
        if not 0 <= self.usage_report_seconds <= 60:
            raise ConfigError("proxy.usage_report_seconds", "must be 0 (no reports) to 60")
