"""Ferry: an inference router for a model API on GPU fleets.

This package holds what every plane shares (the generated wire contract in
``ferry.v1``, errors, config loading, prompt blocks, gRPC and metrics plumbing)
and, in ``ferry.cli``, the entry points that bind the planes together.
``controlplane``, ``dataplane`` and ``agent`` import the shared modules here,
never ``ferry.cli`` and never one another (docs/design.md, rule 5).
"""

__version__ = "0.1.0"
