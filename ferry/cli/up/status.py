"""The supervision section of ``ferry up``'s ready file, as ``ferryctl status --ready-file`` may show it.

Reads only the ready file (no RPC): :func:`supervision` gives one row per
component (``component``, ``pid``, ``restarts``, ``given_up``) from its
``pids``, ``restarts`` and ``given_up``; :func:`render` the lines of a
terminal table with a ``supervision:`` heading (nothing when the ready file
has no ``restarts``: a ``ferry up`` without supervision, or not ``ferry up``).
Cost: O(components).
"""

from __future__ import annotations

from typing import Any


def supervision(ready: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per supervised component of the ready file, sorted by name; empty without ``restarts``."""
    restarts = ready.get("restarts")
    if not isinstance(restarts, dict):
        return []
    pids = ready.get("pids") or {}
    given_up = set(ready.get("given_up") or [])
    return [{"component": name, "pid": pids.get(name), "restarts": int(count), "given_up": name in given_up}
            for name, count in sorted(restarts.items())]


def render(ready: dict[str, Any]) -> list[str]:
    """The lines of the supervision section: a heading, then COMPONENT PID RESTARTS STATE."""
    rows = supervision(ready)
    if not rows:
        return []
    width = max(len("COMPONENT"), *(len(r["component"]) for r in rows))
    lines = [f"supervision: {sum(r['restarts'] for r in rows)} restarts",
             f"  {'COMPONENT':<{width}}  {'PID':>8}  {'RESTARTS':>8}  STATE"]
    for r in rows:
        state = "given up" if r["given_up"] else "supervised"
        lines.append(f"  {r['component']:<{width}}  {r['pid'] or '-':>8}  {r['restarts']:>8}  {state}")
    return lines
