"""``ferry up --regions N``: the layout of several regions on one machine.

Regions are named ``a``, ``b``, ``c``, … (at most 26). Each gets its own
proxy (``proxy-a`` …); node *n* goes to region ``n mod N``. Unless the config
file sets them, the control plane gets round trips between regions
(``region_rtt_ms``: a–b 40 ms, a–c 200 ms, b–c 180 ms, and 40 ms times the
distance in the alphabet for the others) and every proxy simulates them
(``simulate_region_rtt``: a spilled forward waits the round trip first).
"""

from __future__ import annotations

import string
from typing import Any

KNOWN_RTT_MS = {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}
MAX_REGIONS = 26


def region_names(count: int, single: str) -> list[str]:
    """The regions of the run: ``[single]`` for one, else ``a``, ``b``, … (ValueError past 26)."""
    if count <= 1:
        return [single]
    if count > MAX_REGIONS:
        raise ValueError(f"--regions: at most {MAX_REGIONS}")
    return list(string.ascii_lowercase[:count])


def default_rtt(regions: list[str]) -> dict[str, float]:
    """Round trips between every pair of ``regions`` (see the module docstring)."""
    out: dict[str, float] = {}
    for i, a in enumerate(regions):
        for j in range(i + 1, len(regions)):
            key = f"{a}:{regions[j]}"
            out[key] = KNOWN_RTT_MS.get(key, 40.0 * (j - i))
    return out


def with_regions(config: dict[str, Any], regions: list[str]) -> dict[str, Any]:
    """``config`` with the round trips and the proxies' simulated delay, unless it sets them itself."""
    if len(regions) <= 1:
        return config
    out = dict(config)
    controlplane = dict(out.get("controlplane", {}))
    controlplane.setdefault("region_rtt_ms", default_rtt(regions))
    proxy = dict(out.get("proxy", {}))
    proxy.setdefault("simulate_region_rtt", True)
    out["controlplane"], out["proxy"] = controlplane, proxy
    return out
