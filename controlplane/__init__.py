"""The control plane: fleet membership, telemetry, operator intent, and the tables it pushes to proxies.

:mod:`.controller` is the composition root: it builds the shared state and
the services below, wires their callbacks and runs the loops. Services, each
holding only what it uses: :mod:`.fleet` (agents, nodes, drains, cordons),
:mod:`.tables` (compute, version and push the tables), :mod:`.cluster`
(leadership, followers, the other control planes' members), :mod:`.tenants`,
:mod:`.rollout`, :mod:`.allocation` (gang allocation of GPUs), and
:mod:`.regions` (spill weights: the global layer). :mod:`.store` is where
membership, intent and leadership live, with the one writer of operator
intent. :mod:`.api` is the wire: the gRPC servicers (translation only), the
admin token, the agents' join check and wire validation. :mod:`.server`
wires one control plane in a process, :mod:`.main` is ``ferry controlplane``.
"""
