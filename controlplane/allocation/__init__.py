"""Gang allocation: all the GPUs a replica needs on one node, or none.

Pure: :mod:`.gang` (the planner, with aging so neither kind starves),
:mod:`.records` (allocation intent as stored). Its edges sit in the service
layer: :mod:`controlplane.services.allocator` (requests in the store, passes
of the planner, writes back), :mod:`controlplane.services.allocation`
(allocate, list, release).
"""
