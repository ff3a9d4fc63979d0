"""The simulated LLM replica: Triton's KServe v2 service in front of an engine model.

Pure: :mod:`.engine` (continuous batching, chunked prefill, a prefix cache
:mod:`.prefix_cache`, driven by an injected clock), :mod:`.tensors` (the
KServe v2 tensors of docs/CONTRACTS.md), :mod:`.metrics` (the Prometheus text
under Triton's and TensorRT-LLM's names), :mod:`.model` (what the simulated
model answers: words, JSON for a schema, a tool call when tools are offered)
with :mod:`.instance` (a JSON value of a JSON Schema) and :mod:`.choices`
(OpenAI's shapes of an answer). Edges: :mod:`.runner` (one engine
in real time; :meth:`~.runner.EngineRunner.submit_prompt` admits a prompt for
every face), :mod:`.server` (the gRPC servicer, and the slot for one more
face: the HTTP face speaking the peers' APIs, ``tools.peers.replicaface``,
lives with the peer benchmarks).
"""
