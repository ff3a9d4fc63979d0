"""The traffic recorder's part of the ``[proxy]`` section.

Composed into :class:`dataplane.config.ProxySettings` (``record``); checked here (ConfigError naming
``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from ferry.config import positive
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordSettings:
    """The traffic recorder (:mod:`dataplane.record`): which requests are recorded, and its bounds."""

    record_rate: float = 1.0  # share of requests recorded (by a hash of the request id; 0: none, 1: all)
    record_max_rows: int = 20_000  # rows waiting for a report; a further sampled request is dropped, counted
    record_report_rows: int = 2_000  # rows per usage report (the rest wait for the next)
    record_report_bytes: int = 1 << 20  # ... and serialized bytes per report (at least one row)
    record_max_blocks: int = 4096  # a recorded prompt's block hashes: all its 512-token blocks up to this many
    # (the decision hashes only its deepest prefix depth; the simulator needs every block to replay the cache)

    def __post_init__(self) -> None:
        if not 0 <= self.record_rate <= 1:  # also rejects NaN
            raise ConfigError("proxy.record_rate", "must be 0..1")
        positive("proxy", {"record_max_rows": self.record_max_rows, "record_report_rows": self.record_report_rows,
                           "record_report_bytes": self.record_report_bytes,
                           "record_max_blocks": self.record_max_blocks})
