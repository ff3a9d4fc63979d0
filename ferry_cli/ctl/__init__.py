"""``ferryctl``: the operator's command line over the control plane's Admin API.

:mod:`.main` (the table of commands, the parser and the dispatch built from
it), :mod:`.client` (the Admin client, the connection options),
:mod:`.fleet` (status, replicas, nodes, models, table, drain, cordon, alloc,
top), :mod:`.tenants`, :mod:`.rollout`, :mod:`.router`, :mod:`.flow` (tiers
and spill), :mod:`.scale`, :mod:`.cache`, :mod:`.engines`, :mod:`.traffic`,
:mod:`.board` with :mod:`.boardgraph`, :mod:`.whatif` and :mod:`.tune` (the
simulator on recorded traffic), :mod:`.top` (a live view), :mod:`.views`
(rows and aligned tables, pure), :mod:`.completion` (shell completion
scripts).
"""
