"""The in-flight bounds of the proxy: counters of requests in flight, each with a ceiling.

- :class:`InflightLimit`: at most ``limit`` requests in flight in the proxy
  (``[proxy] max_inflight``, default 4,096); :meth:`InflightLimit.enter`
  raises :class:`ferry.errors.Overloaded` with the retry-after to send back
  (``[proxy] retry_after_seconds``).
- :class:`TenantInflight`: the proxy's one per-tenant concurrency counter.
  It counts each tenant's requests in flight in this proxy and, when built
  with a ``limit`` (``[limits] max_inflight_per_tenant``, default 1,024),
  refuses one more beyond it with :class:`ferry.errors.Overloaded` naming the
  limit (RESOURCE_EXHAUSTED with a ``retry-after`` at the servicer), so one
  tenant cannot take every slot of the proxy's overall bound; without one it
  only counts, for a caller that holds each tenant to its own cap
  (:class:`dataplane.admission.tenantlimits.TenantLimits`, a tenant's
  ``max_concurrency``; :class:`dataplane.admission.queues.TierQueues`, a tenant's
  running requests per tier under its ceiling). The map holds only tenants
  with requests in flight,
  so it is bounded by the overall bound. The message names the limit, never
  the tenant's key.

The other bounds of the public port are gRPC server options
(:func:`ferry.grpcutil.server_options`): the message size
(``[limits] max_message_bytes``: a larger request ends RESOURCE_EXHAUSTED)
and concurrent streams per connection (``[limits]
max_streams_per_connection``: HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, so a
client over it waits for a stream to end, nothing is dropped).

Pure; O(1) per call.
"""

from __future__ import annotations

from collections.abc import Iterator

from ferry.errors import ConfigError, Overloaded


class InflightLimit:
    """A counter with a ceiling: the proxy's bound on requests in flight."""

    def __init__(self, limit: int, retry_after: float) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.count = 0

    def enter(self) -> None:
        """Take a slot; raises Overloaded when all ``limit`` are taken."""
        if self.count >= self.limit:
            raise Overloaded(f"proxy in-flight limit of {self.limit} requests reached", self.retry_after)
        self.count += 1

    def leave(self) -> None:
        """Give a slot back."""
        self.count -= 1


class TenantInflight:
    """Requests in flight by tenant, each tenant capped at ``limit`` (None: counted, never refused here)."""

    def __init__(self, limit: int | None = None, retry_after: float = 1.0) -> None:
        if limit is not None and limit < 1:
            raise ConfigError("limits.max_inflight_per_tenant", "must be >= 1")
        self.limit = limit
        self.retry_after = retry_after
        self._counts: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        """``tenant``'s requests in flight."""
        return self._counts.get(tenant, 0)

    def tenants(self) -> Iterator[str]:
        """The tenants with requests in flight, in the order they last started to have some."""
        return iter(self._counts)

    def enter(self, tenant: str) -> None:
        """Take one of ``tenant``'s slots; raises Overloaded when all ``limit`` are taken."""
        held = self._counts.get(tenant, 0)
        if self.limit is not None and held >= self.limit:
            raise Overloaded(f"tenant in-flight limit of {self.limit} requests reached", self.retry_after)
        self._counts[tenant] = held + 1

    def leave(self, tenant: str) -> None:
        """Give one of ``tenant``'s slots back."""
        held = self._counts.get(tenant, 0) - 1
        if held > 0:
            self._counts[tenant] = held
        else:
            self._counts.pop(tenant, None)
