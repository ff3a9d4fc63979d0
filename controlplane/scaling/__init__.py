"""Scaling signals and the warm pool: replicas needed now and for the next ramp, standby nodes to keep.

Pure: :mod:`.plan` (the decision, shared with the day simulator), :mod:`.timings`
(start-up and replacement times measured from the fleet's reports),
:mod:`.demand` (what the plan is fed). Edges: :mod:`.history` (peaks by hour
of week in the store), :mod:`controlplane.services.scaling` (the leader's
periodic task: demand from telemetry and the proxies' reports, the plan, the
metrics, ``Admin.GetScale``).
"""
