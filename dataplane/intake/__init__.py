"""What the request path does with a request before it routes it; below the router, beside nothing above it.

:mod:`.auth` (API key to tenant), :mod:`.validate` (the request checked against
the limits and the table, its prefix keys), :mod:`.tokenwork` (each model's
tokenizer, large prompts off the event loop), :mod:`.idempotency` (a repeated
key joins or replays the first answer). The router (:mod:`dataplane.router`)
uses them; the front doors (:mod:`dataplane.api`, :mod:`dataplane.epp`) sit
above the router and use them too. They import nothing of either.
"""
