"""The decision's scorers, one file each (:mod:`dataplane.pick.plugin`): every module here registers itself.

Built in: ``load`` (:mod:`.load`: slots taken, this proxy's in-flight
included), ``kv`` (:mod:`.kv`: the KV cache used once the request is in),
``staleness`` (:mod:`.staleness`: how old the telemetry is). A new replica
signal is one more file here: a class with ``type_name``, ``consumes``,
``build(args)`` and ``score(replica, need, load, age)``, decorated with
:func:`dataplane.pick.plugin.register`; ``docs/design.md`` walks through one.
"""
