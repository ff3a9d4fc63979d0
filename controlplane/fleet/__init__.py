"""The fleet: nodes and their replicas as agents report them, and what operators do to them.

Pure: :mod:`.view` (members, replicas, last load, connection state, claim
conflicts), :mod:`.telemetry` (hostile-telemetry checks), :mod:`.views`
(nodes, models, slots and usage as operators see them). Edges:
:mod:`.agents` (one session per agent stream, a bounded command mailbox),
:mod:`.members` (each member in the store under a lease), :mod:`.service`
(register, telemetry, drain, cordon, and the views).
"""
