"""The routing tables: computed per region, versioned, pushed to the proxies that watch them.

Pure: :mod:`.compute` (fleet view + catalog + intent at ``now`` to one table
per region, and the versions), :mod:`.quotas` (each table's tier quotas),
:mod:`.spill` (each table's spill routes, from :mod:`controlplane.regions`),
:mod:`.diff` (what changed between two versions, for operators),
:mod:`.delta` (what the proxies must be told between two versions: the
``TableDelta``; applied by :mod:`ferry.tabledelta`), :mod:`.usage` (the
proxies' usage reports, merged), :mod:`.views` (replicas, nodes, models,
slots, tables and proxies as operators see them). Edges: :mod:`.feed` (each
version serialized once, in full and as a delta, for every proxy),
:mod:`.watchers` (one latest-table mailbox per proxy stream, what each proxy
is sent and applied). The compute loop, the push and the wait until the
tables reflect a write are :mod:`controlplane.services.tables`.
"""
