"""The response cache decided on evidence: measure duplicates, decide with hysteresis, cache per tenant.

- :mod:`dataplane.cache.sketch`: a time-windowed set of 64-bit payload hashes with a cap (was this
  exact payload seen within the window?);
- :mod:`dataplane.cache.measure`: per (model, tenant) sliding-window counts of deterministic requests,
  duplicates and the service seconds of the duplicates, reported on the table watch;
- :mod:`dataplane.cache.decide`: the on/off decision per model, with hysteresis;
- :mod:`dataplane.cache.store`: the cache itself, keyed per tenant, bounded in entries and bytes, with
  a TTL and invalidation when a model's version leaves the table;
- :mod:`dataplane.cache.path`: the one place the request path calls (lookup, replay, store).

Pure except :mod:`dataplane.cache.path`, which holds the metrics.
"""
