"""The proxy's public wire: ``ferry.v1.Inference`` and the OpenAI-compatible HTTP API in, the router's calls out.

Pure: :mod:`.validate` (every request field against the limits, sampling
parameters against what the model declares), :mod:`.auth` (API key to
tenant), :mod:`.openai` (OpenAI JSON bodies to ``InferRequest`` and answers
back, errors to HTTP statuses), :mod:`.chat` (chat templates in Jinja's
sandbox). Edges: :mod:`.service` (the gRPC servicer, translation only),
:mod:`.http` (the aiohttp front door, the same router), :mod:`.idempotency`
(joins a repeated request to the one in flight or its recent answer),
:mod:`.tokenwork` (each model's tokenizer; large prompts encoded in worker
threads, bounded).
"""
