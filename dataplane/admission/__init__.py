"""Who gets in and who waits at the proxy: tier queues, fair shares, shedding, tenant limits, cold start.

Pure: :mod:`.queues` (bounded per-tier queues of one model, dispatch and
preemption), :mod:`.fairshare` (deficit round robin among tenants of a tier),
:mod:`.shedding` (queue depth and drain rate to a retry-after),
:mod:`.sharding` (a heavy tenant's shard of replicas), :mod:`.avoid` (where
queued requests should not go), :mod:`.coldstart` (a version whose replicas
are all warming), :mod:`.tenantlimits` (per-tenant rates and concurrency).
Edges: :mod:`.gate` (the asyncio admission around the tier queues),
:mod:`.coldwait` (wait for a table with a ready replica).
"""
