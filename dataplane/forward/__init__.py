"""Forwarding to replicas over KServe v2 gRPC.

Edges: :mod:`.kserve` (one call to a replica with ``tritonclient``'s stubs:
unary and decoupled streams, errors classified), :mod:`.clients` (one client
per replica address, closed when its replica leaves the table).
"""
