"""``ferry picker``: one endpoint picker, Envoy's external processor, until SIGTERM or SIGINT.

It is ``ferry proxy --picker --workers 1`` (:mod:`dataplane.main`): the same
config, flags, table watch, ready file (with ``"picker"``: the address Envoy's
``ext_proc`` cluster lists), readiness and drain. One process per picker, so
that Envoy's cluster holds several and a picker that dies takes only itself
out; ``ferry up`` runs two (``--pickers``).
"""

from __future__ import annotations

import sys

from dataplane import main as proxy


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferry picker``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return proxy.main(["--picker", *args, "--workers", "1"])


if __name__ == "__main__":
    sys.exit(main())
