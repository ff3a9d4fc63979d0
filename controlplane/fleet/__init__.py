"""The fleet: nodes and their replicas as agents report them.

Pure: :mod:`.view` (members, replicas, last load, connection state, claim
conflicts), :mod:`.claims` (ownership claims fleet-wide: their keys and the
rule for taking one), :mod:`.telemetry` (hostile-telemetry checks). Edges:
:mod:`.agents` (one session per agent stream, a bounded command mailbox),
:mod:`.members` (each member and its claims in the store under a lease).
Register, telemetry, drain, cordon and the views are
:mod:`controlplane.services.fleet`; nodes, models, slots and usage as
operators see them are :mod:`controlplane.tables.views`.
"""
