"""The proxy's routing table: validated snapshots from the control plane, and the watch that brings them.

Pure: :mod:`.local` (a snapshot validated and its pools precomputed; a
delta applied first to the snapshot held with :func:`ferry.tabledelta.apply_delta`),
:mod:`.tenants` (the tenants the table carries, or the config file's). Edge:
:mod:`.watch` (``Tables.Watch``: follow the region's table, ACK or NACK each
snapshot or delta, ask for a resync when a delta does not fit, report usage).
"""
