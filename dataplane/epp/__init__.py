"""The endpoint picker: Envoy forwards, Ferry decides (the Inference Extension's endpoint-picker protocol).

- :mod:`.protocol` (pure): the protocol over ext_proc messages: headers in,
  subset hint, served endpoint; the destination (header and ``envoy.lb``
  metadata alike), immediate refusals.
- :mod:`.bodies` (pure): a buffered request read as the front doors read it
  (OpenAI JSON, KServe v2 ``ModelInfer``) into a ``ferry.v1.InferRequest``.
- :mod:`.servicer` (edge): ``ExternalProcessor.Process``, one stream per
  request, on the proxy's own :class:`dataplane.router.Router`.
- :mod:`.main` (wiring): ``ferry picker``.
"""
