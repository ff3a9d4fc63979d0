"""The local harness: what stands a Ferry fleet up on one machine and no component runs in production.

``ferry up``, the end-to-end tests and the benchmarks use it: :mod:`.etcd`
(a local etcd server, a child process like the components) and
:mod:`.tlsgen` (a throw-away CA and certificates, made with ``openssl``).
The child processes themselves are :class:`ferry.procs.Child`, restarted by
:class:`ferry.supervise.Supervisor`: those stay in the shared layer because
the proxy's own workers (``ferry proxy --workers N``, ``dataplane/workers.py``)
run on them too.

It imports the shared layer (``ferry``) only: no plane, not the CLI, not
``tools``; no plane imports it (docs/design.md, rule 5).
"""
