"""Forwarding to replicas over KServe v2 gRPC.

Edges: :mod:`.kserve` (one call to a replica with ``tritonclient``'s stubs:
unary and decoupled streams, errors classified), :mod:`.clients` (one client
per replica address, closed when its replica leaves the table), :mod:`.failures`
(whether a failed forward reached its replica, or was served nothing). The
lowest layer of the request path's forwarding: :mod:`dataplane.failover`
stands on it, and it imports nothing of failover.
"""
