"""Peer routers measured beside Ferry: simulated replicas they can route to, and the benchmark's parts."""
