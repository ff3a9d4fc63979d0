"""The node agent, the simulated LLM replica, and the batch runtime.

The agent (:mod:`.agent`) registers its node's replicas with a control plane,
streams their telemetry and runs the commands it gets; it reads each replica
over KServe v2 (:mod:`.triton`, a real Triton or a simulated replica) and
its Prometheus text (:mod:`.scrape`: aiohttp and ``prometheus_client``'s parser),
or an engine serving OpenAI HTTP itself (:mod:`.openai`). Pure:
:mod:`.inventory` (what the node holds), :mod:`.states` (the per-replica
state machine). :mod:`.replica` is the simulated replica, :mod:`.batch` the
fixed-batch runtime; :mod:`.main` is ``ferry node``.
"""
