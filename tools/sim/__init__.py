"""The fleet simulator: virtual-time replicas driven by the proxy's own decision (:mod:`dataplane.pick.state`).

:mod:`.fleet` (per-replica engines, admit, progress, timeouts),
:mod:`.policies` (Ferry's decision and the peer baselines), :mod:`.workload`
(conversations from a trace), :mod:`.radix` (the peers' approximate prefix
tree), :mod:`.tiers` and :mod:`.regions` (tier and region scenarios),
:mod:`.capacity`, :mod:`.report` and :mod:`.plots`. docs/evaluation.md
has the figures.
"""
