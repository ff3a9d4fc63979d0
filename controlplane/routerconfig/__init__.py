"""Router config rollouts: a candidate ``[proxy]`` config canaried on a share of the proxies, under a guard.

Pure: :mod:`.records` (the stored config versions and the rollout record, the
assignment of versions to proxies, the table's router part), :mod:`.guard`
(the sequential test and the decision). Edge:
:mod:`controlplane.services.routerconfig` (the store writes through the
intent writer, the leader's tick that feeds the guard and applies its
decisions, the views).
"""
