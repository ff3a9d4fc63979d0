"""The proxies' duplicate measurements, merged per model (and tenant), and the cache's state in the tables.

Each proxy's usage report carries ``cache`` rows (``tables_pb2.CacheSample``,
:mod:`dataplane.cache.measure`): per (model, tenant), over the proxy's
sliding window, the deterministic requests that completed, the duplicates
among them, the service seconds of those duplicates, the hits, and whether
the proxy's cache is on for the model. The rows are the state of a window,
not increments, so merging is stateless: :func:`merge_cache` sums, over the
last live report of every proxy (:class:`controlplane.tables.usage.ProxyUsage`,
the same reports ``GetUsage`` merges), the counts, and the rates (count /
that proxy's window). The duplicate share is the summed duplicates over the
summed deterministic requests: exact for what each proxy saw; a repeat that
reached another proxy is not counted, which is what a per-proxy cache would
serve too (a lower bound of the fleet-wide share).

The decision is the proxies' (:mod:`dataplane.cache.decide`: each takes it on
the rate its own cache would serve, with the ``[proxy]`` thresholds);
:func:`attach_cache` writes it into the tables: ``ModelRoute.cache_enabled``
is true when every proxy of the region that reports on the model has its
cache on, and ``cache_proxies`` counts those that do.

Bounds: what :class:`ProxyUsage` keeps (its proxies; at most
:data:`MAX_ROWS` cache rows per report read; names bounded as there). Cost:
O(proxies x rows) per merge.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from controlplane.tables.usage import Entry
from ferry.v1 import admin_pb2, tables_pb2

MAX_ROWS = 4096  # cache rows read per report; the proxy's cache_max_rows is 1,024 by default
MAX_NAME_BYTES = 256


@dataclasses.dataclass(slots=True)
class CacheFigures:
    """Merged measurement of a model, or of a (model, tenant); rates per second of window."""

    deterministic: int = 0
    duplicates: int = 0
    seconds: float = 0.0          # service seconds of the duplicates, over the windows
    deterministic_rate: float = 0.0
    saved_per_s: float = 0.0
    hit_rate: float = 0.0
    hits: int = 0
    window_seconds: float = 0.0
    proxies: set[str] = dataclasses.field(default_factory=set)
    enabled: set[str] = dataclasses.field(default_factory=set)  # proxies with the cache on

    @property
    def share(self) -> float:
        """Duplicates / deterministic requests, 0..1 (0 with none)."""
        return min(1.0, self.duplicates / self.deterministic) if self.deterministic else 0.0

    def add(self, proxy_id: str, sample: tables_pb2.CacheSample) -> None:
        """One proxy's row."""
        window = max(sample.window_seconds, 1e-3)
        self.deterministic += sample.deterministic
        self.duplicates += sample.duplicates
        self.seconds += sample.duplicate_seconds
        self.deterministic_rate += sample.deterministic / window
        self.saved_per_s += sample.duplicate_seconds / window
        self.hit_rate += sample.hits / window
        self.hits += sample.hits
        self.window_seconds = max(self.window_seconds, sample.window_seconds)
        self.proxies.add(proxy_id)
        if sample.enabled:
            self.enabled.add(proxy_id)


def valid_sample(sample: tables_pb2.CacheSample) -> bool:
    """A row with names, finite non-negative seconds and no more duplicates than requests."""
    return (bool(sample.model) and len(sample.model.encode()) <= MAX_NAME_BYTES
            and len(sample.tenant.encode()) <= MAX_NAME_BYTES and sample.duplicates <= sample.deterministic
            and 0 <= sample.duplicate_seconds < float("inf") and 0 < sample.window_seconds < float("inf"))


Key = tuple[str, str, str]  # (region, model, tenant); tenant "" for the model's row


def merge_cache(entries: Iterable[Entry]) -> dict[Key, CacheFigures]:
    """Per (region, model, tenant) and per (region, model, "") from the proxies' last reports; rows that are
    malformed (:func:`valid_sample`) are skipped."""
    out: dict[Key, CacheFigures] = {}
    for entry in entries:
        for sample in list(entry.report.cache)[:MAX_ROWS]:
            if not valid_sample(sample):
                continue
            for key in ((entry.region, sample.model, sample.tenant), (entry.region, sample.model, "")):
                figures = out.get(key)
                if figures is None:
                    figures = out[key] = CacheFigures()
                figures.add(entry.proxy_id, sample)
    return out


def attach_cache(tables: Mapping[str, tables_pb2.TableSnapshot], merged: Mapping[Key, CacheFigures]) -> None:
    """Write each model's cache state into its region's table (``ModelRoute.cache_enabled``, ``cache_proxies``)."""
    for region, snapshot in tables.items():
        for route in snapshot.models:
            figures = merged.get((region, route.model, ""))
            if figures is None or not figures.enabled:
                continue
            route.cache_enabled = figures.enabled == figures.proxies
            route.cache_proxies = len(figures.enabled)


def cache_views(merged: Mapping[Key, CacheFigures], *, model: str = "", by_tenant: bool = False) -> list[
        admin_pb2.CacheView]:
    """``GetCache``: per model (all regions), or per (model, tenant), sorted; ``model`` filters."""
    rolled: dict[tuple[str, str], CacheFigures] = {}
    for (_, name, tenant), f in merged.items():
        if (model and name != model) or (bool(tenant) != by_tenant):
            continue
        into = rolled.get((name, tenant))
        if into is None:
            into = rolled[(name, tenant)] = CacheFigures()
        into.deterministic += f.deterministic
        into.duplicates += f.duplicates
        into.seconds += f.seconds
        into.deterministic_rate += f.deterministic_rate
        into.saved_per_s += f.saved_per_s
        into.hit_rate += f.hit_rate
        into.hits += f.hits
        into.window_seconds = max(into.window_seconds, f.window_seconds)
        into.proxies |= f.proxies
        into.enabled |= f.enabled
    return [admin_pb2.CacheView(
        model=name, tenant=tenant, deterministic_rate=f.deterministic_rate, duplicate_share=f.share,
        saved_gpu_seconds_per_s=f.saved_per_s, saved_gpu_seconds=f.seconds, hit_rate=f.hit_rate,
        proxies=len(f.proxies), proxies_enabled=len(f.enabled), window_seconds=f.window_seconds,
        deterministic=f.deterministic, duplicates=f.duplicates, hits=f.hits)
        for (name, tenant), f in sorted(rolled.items())]
