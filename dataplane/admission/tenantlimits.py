"""Per-tenant limits at the proxy: requests/s and tokens/s token buckets, and a concurrency cap.

:class:`TenantLimits` checks a request of ``tokens`` (prompt + max tokens)
against its tenant's :class:`ferry.config.TenantConfig` limits, each 0 for
none: ``requests_per_second`` and ``tokens_per_second`` are token buckets
holding one second's worth (burst = rate), refilled continuously;
``max_concurrency`` caps the tenant's requests in flight at this proxy,
counted by the proxy's one per-tenant counter
(:class:`dataplane.admission.limits.TenantInflight`).
A refusal is :class:`ferry.errors.Overloaded` naming the limit, with the
retry-after the bucket needs to refill (concurrency: ``concurrency_retry``,
default 1 s). These static limits sit beside the queue-driven shedding of
:mod:`dataplane.admission.queues`, which reacts to what the fleet actually drains.

Limits are per proxy (a fleet of N proxies lets a tenant through N times
the rate). Clock injected (``now``). State per tenant with traffic, bounded
by the tenants served (plus the anonymous one): when the set changes
(:mod:`dataplane.table.tenants`) :meth:`TenantLimits.retain` drops the buckets of
tenants that left it.

Cost: O(1) per request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from dataplane.admission.limits import TenantInflight
from ferry.config import TenantConfig
from ferry.errors import Overloaded


@dataclasses.dataclass(slots=True)
class Bucket:
    """A token bucket of ``rate`` per second and ``rate`` deep."""

    rate: float
    level: float
    at: float

    def take(self, amount: float, now: float) -> float:
        """Take ``amount``; 0.0 when taken, else the seconds until it would fit."""
        self.level = min(self.rate, self.level + (now - self.at) * self.rate)
        self.at = now
        need = min(amount, self.rate)  # a request bigger than a second's worth waits for a full bucket
        if self.level >= need:
            self.level -= need
            return 0.0
        return (need - self.level) / self.rate


class TenantLimits:
    """The per-tenant buckets and in-flight counts of one proxy; see the module docstring."""

    def __init__(self, *, concurrency_retry: float = 1.0) -> None:
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self._inflight = TenantInflight()  # requests in flight of tenants with a max_concurrency
        self.concurrency_retry = concurrency_retry

    def admit(self, tenant: TenantConfig, tokens: int, now: float) -> bool:
        """Count the request in; raises Overloaded when over a limit. True when it must be released."""
        if tenant.max_concurrency and self._inflight.count(tenant.name) >= tenant.max_concurrency:
            raise Overloaded(f"tenant {tenant.name}: max_concurrency of {tenant.max_concurrency} reached",
                             self.concurrency_retry)
        for rate, buckets, amount, key in ((tenant.requests_per_second, self._requests, 1, "requests_per_second"),
                                           (tenant.tokens_per_second, self._tokens, tokens, "tokens_per_second")):
            if not rate:
                continue
            bucket = buckets.get(tenant.name)
            if bucket is None or bucket.rate != rate:
                bucket = buckets[tenant.name] = Bucket(rate, rate, now)
            wait = bucket.take(amount, now)
            if wait > 0:
                raise Overloaded(f"tenant {tenant.name}: {key} limit of {rate:g} reached", round(max(wait, 0.001), 3))
        if tenant.max_concurrency:
            self._inflight.enter(tenant.name)
            return True
        return False

    def headers(self, tenant: TenantConfig, now: float) -> dict[str, str]:
        """OpenAI's rate-limit headers for ``tenant`` at ``now``: ``x-ratelimit-limit-requests``,
        ``-remaining-requests``, ``-reset-requests`` (and the ``-tokens`` three) for each bucket the tenant has.

        limit: the bucket's depth (one second's worth); remaining: what it holds now, whole; reset: the time
        until it is full again, as OpenAI writes durations (``0.25s``, ``1s``). No header for a limit of 0 (none).
        """
        out: dict[str, str] = {}
        for rate, buckets, unit in ((tenant.requests_per_second, self._requests, "requests"),
                                    (tenant.tokens_per_second, self._tokens, "tokens")):
            if not rate:
                continue
            bucket = buckets.get(tenant.name)
            level = rate if bucket is None or bucket.rate != rate else min(
                rate, bucket.level + max(0.0, now - bucket.at) * rate)
            out[f"x-ratelimit-limit-{unit}"] = f"{rate:g}"
            out[f"x-ratelimit-remaining-{unit}"] = str(max(0, math.floor(level)))
            out[f"x-ratelimit-reset-{unit}"] = f"{round((rate - level) / rate, 3):g}s"
        return out

    def retain(self, names: Collection[str]) -> None:
        """Forget the buckets of tenants not in ``names`` (in-flight counts end with their requests)."""
        for buckets in (self._requests, self._tokens):
            for name in [n for n in buckets if n not in names]:
                del buckets[name]

    def release(self, tenant: TenantConfig) -> None:
        """A request admitted with ``admit() == True`` ended."""
        self._inflight.leave(tenant.name)
