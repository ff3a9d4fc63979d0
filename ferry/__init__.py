"""Ferry: an inference router for a model API on GPU fleets.

This package is the shared bottom layer: what every plane shares (the
generated wire contract in ``ferry.v1``, errors, config loading, prompt
blocks, gRPC and metrics plumbing, the child processes of :mod:`.procs` and
:mod:`.supervise`). ``controlplane``, ``dataplane`` and ``agent`` import the
shared modules here, never one another; above them stand the commands
(``ferry_cli``) and the local harness (``harness``), which nothing here
imports (docs/design.md, rule 5). ``python -m ferry`` (``__main__``) is the
one exception: it is the ``ferry`` command, from ``ferry_cli``.
"""

__version__ = "0.1.0"
