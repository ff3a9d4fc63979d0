"""``ferryctl``: the operator's command line over the control plane's Admin API.

:mod:`.main` (parser, client, the replica/node/model/table commands),
:mod:`.tenants`, :mod:`.rollout`, :mod:`.flow` (tiers and spill),
:mod:`.top` (a live view), :mod:`.views` (rows and aligned tables, pure),
:mod:`.completion` (shell completion scripts).
"""
