"""Which replica serves one attempt of a request: the proxy's decision and its state.

Pure: :mod:`.decide` (the whole decision: region step, filters, remembered
placement, bounded-load ring, new-key placement, prefill detour, P2C),
composed of plug-ins (:mod:`.plugin`: the ``Filter``, ``Scorer`` and
``Picker`` protocols, one registry, the plan read from ``[proxy.pick]``;
:mod:`.filters`, :mod:`.scorers` one file a scorer, :mod:`.pickers`), its
settings (:mod:`.settings`),
:mod:`.p2c` (power of two choices on a load score, the last step),
:mod:`.ring` (consistent hashing with bounded load), :mod:`.pool` (what the
pick needs of one model version, computed once per table), :mod:`.prefix`
(prefix keys and hot-key detection), :mod:`.outlier` (ejection of replicas
that fail or run far slower than their peers), :mod:`.unreachable` (replicas
that refused a connection, out until newer telemetry or a re-probe). State
around it: :mod:`.picker` (:class:`.picker.PickState`: in-flight load, placements, outliers, refused
replicas, retry budget; the one object the router and the fleet simulator
both drive).
"""
