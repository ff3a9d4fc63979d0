"""Gang allocation: all the GPUs a replica needs on one node, or none.

Pure: :mod:`.gang` (the planner, with aging so neither kind starves),
:mod:`.records` (allocation intent as stored). Edges: :mod:`.allocator`
(requests in the store, passes of the planner, writes back), :mod:`.service`
(allocate, list, release).
"""
