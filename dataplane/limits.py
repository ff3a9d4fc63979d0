"""Per-tenant bounds of the proxy: requests in flight per tenant.

:class:`TenantInflight` counts each tenant's requests in flight in this
proxy and refuses one more beyond ``limit`` (``[limits]
max_inflight_per_tenant``, default 1,024) with
:class:`ferry.errors.Overloaded` naming the limit (RESOURCE_EXHAUSTED with a
``retry-after`` at the servicer), so one tenant cannot take every slot of
the proxy's overall bound. The map holds only tenants with requests in
flight, so it is bounded by that overall bound. The message names the limit,
never the tenant's key. Pure; O(1) per call.

The other bounds of the public port are gRPC server options
(:func:`ferry.grpcutil.server_options`): the message size
(``[limits] max_message_bytes``: a larger request ends RESOURCE_EXHAUSTED)
and concurrent streams per connection (``[limits]
max_streams_per_connection``: HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, so a
client over it waits for a stream to end, nothing is dropped).
"""

from __future__ import annotations

from ferry.errors import ConfigError, Overloaded


class TenantInflight:
    """Requests in flight by tenant, each tenant capped at ``limit``."""

    def __init__(self, limit: int, retry_after: float) -> None:
        if limit < 1:
            raise ConfigError("limits.max_inflight_per_tenant", "must be >= 1")
        self.limit = limit
        self.retry_after = retry_after
        self._counts: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        return self._counts.get(tenant, 0)

    def enter(self, tenant: str) -> None:
        """Take one of ``tenant``'s slots; raises Overloaded when all ``limit`` are taken."""
        held = self._counts.get(tenant, 0)
        if held >= self.limit:
            raise Overloaded(f"tenant in-flight limit of {self.limit} requests reached", self.retry_after)
        self._counts[tenant] = held + 1

    def leave(self, tenant: str) -> None:
        """Give one of ``tenant``'s slots back."""
        held = self._counts.get(tenant, 0) - 1
        if held > 0:
            self._counts[tenant] = held
        else:
            self._counts.pop(tenant, None)
