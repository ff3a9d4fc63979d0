"""The proxies' usage reports, kept per proxy and merged per model, region and tier: pure.

Each proxy sends a ``Report`` on its ``Tables.Watch`` stream every second
(:mod:`dataplane.usage`): per model and tier, counts over its last window,
the p50 and p99 of the requests answered OK, the offered rate and its tier
queue's depth. :class:`ProxyUsage` keeps the last report of each proxy with
the time it was made (this control plane's monotonic clock less the age it
had on arrival) and forgets it ``expire_seconds`` (5 s) later, or at once
when the proxy's stream ends here (so a proxy that moved to another control
plane is not counted twice). :func:`merge` turns the live reports into
:class:`Figures` per (model, region, tier): rates add up (each proxy's count
/ its window), queues add up, and the p99 (and p50) is the **highest of the
proxies'** — an upper bound of the merged quantile: if each proxy has at
least 99 % of its requests at or below its own p99, the union has at least
99 % at or below the highest of them. It is exact with one proxy and never
under-reports; merging histograms would be exact but sends ~330 counters per
row instead of two numbers. :func:`rollup` merges further (over tiers, over
models) by the same rules, so a model's row shows its slowest tier's p99
(``ferryctl top --by-tier`` shows each tier's).

Followers relay, the leader merges: a follower adds the reports of its own
proxies (:meth:`ProxyUsage.relay`, each with its age) to its
``FollowerReport`` every tick, and the leader keeps them under the proxy's id
(:meth:`ProxyUsage.absorb`; the freshest report of a proxy wins). So the
leader alone answers ``GetUsage``, ``GetTiers`` and ``GetSpill`` for the whole
fleet and exports the merged metrics, and ferryctl asks it as ``nodes``
does. This is simpler and more correct than ferryctl asking every control
plane and merging: shares (shed / offered) cannot be merged from answers that
lost the rates behind them, and a proxy that moved between control planes
would be counted twice. The cost is one tick (0.5 s) more delay for proxies
of followers.

Bounds: at most ``max_proxies`` proxies (a further one is ignored, with the
reason returned for the caller to count), ``max_samples`` (1,024) rows per
report and ``max_total_samples`` (262,144, some 30 MB) over all the reports
kept (a report past it is ignored),
names of at most ``max_name_bytes``; a malformed report is ignored whole.
Cost: O(1) per report kept; O(proxies x rows) per merge.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from ferry.config import TIERS
from ferry.v1 import admin_pb2, tables_pb2

DEFAULT_EXPIRE_SECONDS = 5.0
MAX_WINDOW_SECONDS = 3600.0

Key = tuple[str, str, str]  # (model, region, tier)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """The last report of one proxy."""

    proxy_id: str
    region: str
    made_at: float          # this control plane's monotonic clock, when the proxy made it
    report: tables_pb2.Report
    stream: object | None   # the watch stream it came on (None: relayed by a follower)


@dataclasses.dataclass(slots=True)
class Figures:
    """Merged usage of a (model, region, tier), or of a rollup of them; rates per second."""

    request_rate: float = 0.0
    error_rate_per_s: float = 0.0
    shed_per_s: float = 0.0
    spilled_per_s: float = 0.0
    offered_rate: float = 0.0
    queued: int = 0
    p99_seconds: float = 0.0
    p50_seconds: float = 0.0
    guard_per_s: float = 0.0  # guardrail hook seconds per second (over request_rate: the mean per request)
    proxies: int = 0

    @property
    def shed_rate(self) -> float:
        """Shed / offered, 0..1 (0 with nothing offered)."""
        return min(1.0, self.shed_per_s / self.offered_rate) if self.offered_rate > 0 else 0.0

    @property
    def error_rate(self) -> float:
        """Failed / ended (not shed), 0..1."""
        return min(1.0, self.error_rate_per_s / self.request_rate) if self.request_rate > 0 else 0.0

    def add(self, other: Figures) -> None:
        """Merge ``other`` into these: rates and queues add up, quantiles take the highest."""
        self.request_rate += other.request_rate
        self.error_rate_per_s += other.error_rate_per_s
        self.shed_per_s += other.shed_per_s
        self.spilled_per_s += other.spilled_per_s
        self.offered_rate += other.offered_rate
        self.queued += other.queued
        self.p99_seconds = max(self.p99_seconds, other.p99_seconds)
        self.p50_seconds = max(self.p50_seconds, other.p50_seconds)
        self.guard_per_s += other.guard_per_s
        self.proxies += other.proxies


def sample_figures(sample: tables_pb2.UsageSample, window: float) -> Figures:
    """One proxy's row as rates over its window."""
    answered = sample.p99_seconds > 0
    return Figures(
        request_rate=sample.requests / window, error_rate_per_s=sample.errors / window,
        shed_per_s=sample.shed / window, spilled_per_s=sample.spilled / window,
        offered_rate=max(sample.offered_per_second, (sample.requests + sample.shed) / window),
        queued=sample.queued, p99_seconds=sample.p99_seconds if answered else 0.0,
        p50_seconds=sample.p50_seconds if answered else 0.0, guard_per_s=sample.guard_seconds / window, proxies=1,
    )


def check_report(report: tables_pb2.Report, *, max_samples: int, max_name_bytes: int) -> str | None:
    """The reason ``report`` is malformed, or None."""
    if not 0 < report.window_seconds <= MAX_WINDOW_SECONDS:
        return "window_seconds"
    if len(report.usage) > max_samples:
        return "usage_rows"
    for s in report.usage:
        if not s.model or not s.tier or len(s.model.encode()) > max_name_bytes or len(s.tier) > max_name_bytes:
            return "usage_name"
        if not all(math.isfinite(v) and v >= 0
                   for v in (s.p99_seconds, s.p50_seconds, s.offered_per_second, s.guard_seconds)):
            return "usage_value"
    return None


class ProxyUsage:
    """The last report of every proxy; see the module docstring."""

    def __init__(self, *, clock: Callable[[], float], max_proxies: int = 4096, max_samples: int = 1024,
                 max_total_samples: int = 262_144, max_name_bytes: int = 256,
                 expire_seconds: float = DEFAULT_EXPIRE_SECONDS) -> None:
        self._clock = clock
        self.max_proxies = max_proxies
        self.max_samples = max_samples
        self.max_total_samples = max_total_samples
        self._samples = 0  # rows over the reports kept
        self.max_name_bytes = max_name_bytes
        self.expire_seconds = expire_seconds
        self._entries: dict[str, Entry] = {}

    def put(self, proxy_id: str, region: str, report: tables_pb2.Report, *, age: float = 0.0,
            stream: object | None = None) -> str | None:
        """Keep ``report`` as ``proxy_id``'s last (unless a fresher one is kept); returns why it was ignored."""
        reason = check_report(report, max_samples=self.max_samples, max_name_bytes=self.max_name_bytes)
        if reason is not None:
            return f"usage_report_{reason}"
        if not proxy_id or not region or not age >= 0:
            return "usage_report_field"
        if age >= self.expire_seconds:
            return "usage_report_expired"
        now = self._clock()
        made_at = now - age
        old = self._entries.get(proxy_id)
        if old is None and len(self._entries) >= self.max_proxies:
            self.expire()
            if len(self._entries) >= self.max_proxies:
                return "usage_report_proxies"
        if old is not None and old.made_at > made_at:
            return None  # a fresher report of the proxy is kept (it moved, or a relay lags)
        kept = len(old.report.usage) if old is not None else 0
        if self._samples - kept + len(report.usage) > self.max_total_samples:
            return "usage_report_total"
        self._samples += len(report.usage) - kept
        self._entries[proxy_id] = Entry(proxy_id, region, made_at, report, stream)
        return None

    def drop(self, proxy_id: str, stream: object) -> None:
        """The proxy's watch stream ``stream`` ended: forget what came on it."""
        entry = self._entries.get(proxy_id)
        if entry is not None and entry.stream is not None and entry.stream is stream:
            self._forget(proxy_id)

    def _forget(self, proxy_id: str) -> None:
        self._samples -= len(self._entries.pop(proxy_id).report.usage)

    def expire(self) -> None:
        now = self._clock()
        for proxy_id in [p for p, e in self._entries.items() if now - e.made_at >= self.expire_seconds]:
            self._forget(proxy_id)

    def entries(self) -> list[Entry]:
        """The live reports, by proxy id."""
        self.expire()
        return [self._entries[p] for p in sorted(self._entries)]

    def relay(self) -> list[admin_pb2.ProxyUsageReport]:
        """What a follower sends the leader: the reports of the proxies watching from it, with their age."""
        now = self._clock()
        return [admin_pb2.ProxyUsageReport(proxy_id=e.proxy_id, region=e.region, age_seconds=now - e.made_at,
                                           report=e.report)
                for e in self.entries() if e.stream is not None]

    def absorb(self, relayed: Sequence[admin_pb2.ProxyUsageReport]) -> list[str]:
        """A follower's relay, on the leader; returns the reasons of the reports ignored."""
        if len(relayed) > self.max_proxies:
            return ["usage_relay_rows"]
        ignored = []
        for item in relayed:
            reason = self.put(item.proxy_id, item.region, item.report, age=item.age_seconds)
            if reason is not None:
                ignored.append(reason)
        return ignored

    def figures(self) -> dict[Key, Figures]:
        """The live reports merged per (model, region, tier) (:func:`merge`)."""
        return merge(self.entries())


def merge(entries: Iterable[Entry]) -> dict[Key, Figures]:
    """Figures per (model, region, tier) from the proxies' last reports."""
    out: dict[Key, Figures] = {}
    for entry in entries:
        window = entry.report.window_seconds
        for sample in entry.report.usage:
            key = (sample.model, entry.region, sample.tier)
            figures = out.get(key)
            if figures is None:
                figures = out[key] = Figures()
            figures.add(sample_figures(sample, window))
    return out


def rollup(figures: Mapping[Key, Figures], key: Callable[[Key], tuple[str, ...]]) -> dict[tuple[str, ...], Figures]:
    """Merge figures whose ``key(k)`` is equal (rates add, quantiles take the highest)."""
    out: dict[tuple[str, ...], Figures] = {}
    for k, f in figures.items():
        merged = out.get(key(k))
        if merged is None:
            merged = out[key(k)] = Figures()
        merged.add(f)
    return out


def _fill(row: admin_pb2.UsageRow, f: Figures) -> None:
    row.request_rate = f.request_rate
    row.p99_seconds = f.p99_seconds
    row.shed_rate = f.shed_rate
    row.error_rate = f.error_rate
    row.guard_seconds = f.guard_per_s / f.request_rate if f.request_rate > 0 else 0.0


def _tier_order(tier: str) -> tuple[int, str]:
    return (TIERS.index(tier), "") if tier in TIERS else (len(TIERS), tier)


def usage_rows(base: Iterable[admin_pb2.UsageRow], figures: Mapping[Key, Figures], *,
               by_tier: bool) -> list[admin_pb2.UsageRow]:
    """``GetUsage``'s rows: the telemetry rows per (model, region) with the proxies' figures over every
    tier, plus a row for a pair only proxies know; with ``by_tier``, each (model, region)'s tier rows after it
    (``queued``: the proxies' tier queues)."""
    per_model = rollup(figures, lambda k: (k[0], k[1]))
    rows: dict[tuple[str, str], admin_pb2.UsageRow] = {}
    for row in base:
        copy = admin_pb2.UsageRow()
        copy.CopyFrom(row)
        rows[(row.model, row.region)] = copy
    for (model, region) in per_model:
        rows.setdefault((model, region), admin_pb2.UsageRow(model=model, region=region))
    tiers: dict[tuple[str, str], list[tuple[str, Figures]]] = {}
    for (model, region, tier), f in figures.items():
        tiers.setdefault((model, region), []).append((tier, f))
    out = []
    for pair in sorted(rows):
        row = rows[pair]
        merged = per_model.get(pair)
        if merged is not None:
            _fill(row, merged)
        out.append(row)
        if by_tier:
            for tier, f in sorted(tiers.get(pair, []), key=lambda t: _tier_order(t[0])):
                tier_row = admin_pb2.UsageRow(model=pair[0], region=pair[1], tier=tier, queued=f.queued)
                _fill(tier_row, f)
                out.append(tier_row)
    return out


def tier_views(quotas: Mapping[str, Iterable[tables_pb2.TierQuota]], figures: Mapping[Key, Figures], *,
               region: str = "") -> list[admin_pb2.TierView]:
    """``GetTiers``: per region and tier, the table's quota (``quotas``: per region) and the proxies' figures
    over every model (the highest model's p99)."""
    per_tier = rollup(figures, lambda k: (k[1], k[2]))
    views: dict[tuple[str, str], admin_pb2.TierView] = {}
    for name, tier_quotas in quotas.items():
        for q in tier_quotas:
            views[(name, q.tier)] = admin_pb2.TierView(
                region=name, tier=q.tier, reserved_share=q.reserved_share, reserved_slots=q.reserved_slots,
                quota_slots=q.quota_slots, lent_slots=q.lent_slots)
    for (name, tier), f in per_tier.items():
        view = views.get((name, tier))
        if view is None:
            view = views[(name, tier)] = admin_pb2.TierView(region=name, tier=tier)
        view.request_rate, view.queued, view.p99_seconds = f.request_rate, f.queued, f.p99_seconds
        view.shed_rate, view.offered_rate = f.shed_rate, f.offered_rate
    keys = sorted((k for k in views if not region or k[0] == region), key=lambda k: (k[0], _tier_order(k[1])))
    return [views[k] for k in keys]


def spill_views(routes: Mapping[str, Iterable[tables_pb2.SpillRoute]], configured: Mapping[tuple[str, str], float],
                figures: Mapping[Key, Figures], *, region: str = "") -> list[admin_pb2.SpillView]:
    """``GetSpill``: per (source, target) pair, configured (``configured``: round trips) or in a table's
    spill routes (``routes``: per source region), its weight and round trip, and the spilled rate.

    Proxies report how much they spilled, not where to: a source's spilled rate is split over its pairs
    by weight, which is exact with one target and the expectation with several (the proxy draws the
    target by weight); over all its pairs evenly when every weight is 0 (the weights changed since).
    """
    pairs: dict[tuple[str, str], admin_pb2.SpillView] = {
        (s, t): admin_pb2.SpillView(source=s, target=t, rtt_ms=rtt) for (s, t), rtt in configured.items()}
    for source, spill in routes.items():
        for route in spill:
            pairs[(source, route.region)] = admin_pb2.SpillView(source=source, target=route.region,
                                                                weight=route.weight, rtt_ms=route.rtt_ms)
    spilled = rollup(figures, lambda k: (k[1],))
    for (source,), f in spilled.items():
        mine = [v for (s, _), v in pairs.items() if s == source]
        total = sum(v.weight for v in mine)
        for view in mine:
            share = view.weight / total if total > 0 else 1.0 / len(mine)
            view.spilled_rate = f.spilled_per_s * share
    return [pairs[k] for k in sorted(pairs) if not region or k[0] == region]
