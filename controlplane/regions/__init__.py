"""The global layer: how much of a saturated region's interactive work each other region takes.

Pure: :mod:`.weights` (spill weights from measured rates, RTT and the
latency budget), :mod:`.control` (the spill controller, steered by
saturation). :mod:`controlplane.tables.spill` computes the weights for each
table and adds the spill routes.
"""
