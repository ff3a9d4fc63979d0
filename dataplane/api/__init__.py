"""The proxy's public wire: ``ferry.v1.Inference`` in, the router's calls out.

Pure: :mod:`.validate` (every request field against the limits),
:mod:`.auth` (API key to tenant). Edges: :mod:`.service` (the gRPC servicer,
translation only), :mod:`.idempotency` (joins a repeated request to the one
in flight or its recent answer), :mod:`.tokenwork` (each model's tokenizer;
large prompts encoded in worker threads, bounded).
"""
