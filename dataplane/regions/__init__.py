"""The global layer at the proxy: when a request leaves its region, and for which replica.

Pure: :mod:`.choice` (the region step of the decision, from the table's
spill weights and the local queue), :mod:`.remote` (the other regions'
replicas as the table gives them, and the pick among them).
"""
