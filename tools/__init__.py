"""Tools around Ferry: the demo, benchmarks, the fleet simulator, trace replay, peer routers side by side.

:mod:`.demo` (``make demo``), :mod:`.bench` (real-time benchmarks, figures in
``bench-results/``), :mod:`.sim` with :mod:`.simulate` (the fleet simulator,
driving the proxy's own decision in virtual time), :mod:`.replay` and
:mod:`.trace` (request traces), :mod:`.fetch_traces` (the public traces,
pinned by sha256), :mod:`.peers` (the peer routers on the same replicas),
:mod:`.process_fleet` (a fleet of real processes for benchmarks and tests),
:mod:`.triton` (a real Triton server), :mod:`.genproto` (the stubs).
Production code never imports this package.
"""
