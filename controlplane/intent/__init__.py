"""Operator intent above the store: the records decoded from their keys, and the one way they are written.

:mod:`.cache` mirrors ``/ferry/intent/`` (drains, cordons, allocations,
pending requests, rollouts, tenants), each value decoded by its record's own
``decode`` (:mod:`controlplane.allocation.records`,
:mod:`controlplane.rollout.plan`, :mod:`controlplane.tenants.records`);
:mod:`.writer` is the one way operator intent is written (check,
conditional put, wait for the echo and, through an injected ``reflect``, the
tables). The codec layer between the store (keys and bytes) and the services.
"""
