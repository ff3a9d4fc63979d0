"""The services: each concern's operations as the servicers and the controller call them.

One module per concern, one ``<Concern>Service`` class in it (docs/design.md,
vocabulary: *service*): :mod:`.fleet` (register, telemetry, drain, cordon),
:mod:`.tables` (the compute loop, the push, the wait for a write),
:mod:`.peers` (leadership, the shared fleet, ``Admin.Follow``),
:mod:`.status` (``Admin.GetStatus``), :mod:`.tenants`, :mod:`.rollout`,
:mod:`.routerconfig`, :mod:`.allocation` (with :mod:`.allocator`, the edge of
the gang planner), :mod:`.scaling`, :mod:`.engines`, :mod:`.traffic`. A
service holds state and I/O (intent writes, the store, the peers) around the
pure policy of its concern's subpackage below; it raises
:class:`ferry.errors.FerryError` subclasses and never speaks gRPC
(:mod:`controlplane.api` translates).
"""
