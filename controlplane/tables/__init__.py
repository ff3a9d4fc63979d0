"""The routing tables: computed per region, versioned, pushed to the proxies that watch them.

Pure: :mod:`.compute` (fleet view + catalog + intent at ``now`` to one table
per region, and the versions), :mod:`.quotas` (each table's tier quotas),
:mod:`.diff` (what changed between two versions, for operators),
:mod:`.delta` (what the proxies must be told between two versions: the
``TableDelta``; applied by :mod:`ferry.tabledelta`), :mod:`.usage` (the
proxies' usage reports, merged), :mod:`.views` (replicas, tables and proxies
as operators see them). Edges: :mod:`.feed` (each version serialized once,
in full and as a delta, for every proxy), :mod:`.watchers` (one latest-table
mailbox per proxy stream, what each proxy is sent and applied),
:mod:`.service` (the compute loop, the push, and the wait until the tables
reflect a write).
"""
