"""A router config version's text: which ``[proxy]`` keys may change live, parsed and digested alike by both planes.

A router config (``ferryctl router rollout candidate.toml``) is TOML with one
section, ``[proxy]``, holding only the keys of :data:`LIVE_KEYS`: the
decision's parameters, which a proxy can swap between two requests without
dropping any state (:meth:`dataplane.router.Router.reconfigure`):

- the pick (``PickSettings``): ``walk_limit``, ``detour_factor``,
  ``place_factor``, ``telemetry_fresh_seconds``, ``telemetry_stale_seconds``;
  the ring's ``load_factor`` (``TableSettings``; from the next table applied,
  and a table's own ring parameters still win);
- the region step (``RegionSettings``): ``spill_queue_ms``, ``spill_headroom``;
- outlier ejection (``OutlierSettings``): every ``outlier_*`` key;
- retries (``RetrySettings``): ``max_attempts``, ``retry_tiers``,
  ``retry_budget_ratio``, ``retry_budget_min_per_second``,
  ``max_continuations``;
- the tier queues (``QueueSettings``): ``admission_capacity_share``,
  ``queue_bounds``, ``queue_timeouts``, ``queue_max_total``,
  ``free_queue_share``, ``interactive_headroom_seconds``,
  ``interactive_headroom_max_share``, ``tenant_ceiling``.

Everything else needs a restart: a key that sizes a structure (``placements``,
``hot_keys``, ``prefix_depths``, ``fair_quantum_tokens``, the retry budget's
window), or belongs to the process (listen addresses, TLS, tracing, the
cache). Such a key is refused with a :class:`ferry.errors.ConfigError` naming
``proxy.<key>`` and saying it needs a restart. :func:`parse` checks the shape
(TOML, the one section, live keys, values of a TOML scalar or list type); the
proxy checks the values against its settings' own rules
(:mod:`dataplane.routerconfig`) and refuses a bad one naming the key, which
rolls the rollout back. A version's text applies over the proxy's own file:
a key it does not name keeps the file's value.

Bounds: a text of at most :data:`MAX_TEXT_BYTES` (16 KiB). Pure.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping
from typing import Any

from ferry.errors import ConfigError

MAX_TEXT_BYTES = 16 * 1024
SECTION = "proxy"

PICK_KEYS = ("walk_limit", "detour_factor", "place_factor", "telemetry_fresh_seconds", "telemetry_stale_seconds")
TABLE_KEYS = ("load_factor",)
REGION_KEYS = ("spill_queue_ms", "spill_headroom")
OUTLIER_KEYS = ("outlier_consecutive_failures", "outlier_latency_factor", "outlier_window_seconds",
                "outlier_min_decode_tokens", "outlier_min_prefill_tokens", "outlier_base_ejection_seconds",
                "outlier_max_ejection_seconds", "outlier_max_ejected_share")
RETRY_KEYS = ("max_attempts", "retry_tiers", "retry_budget_ratio", "retry_budget_min_per_second",
              "max_continuations")
QUEUE_KEYS = ("admission_capacity_share", "queue_bounds", "queue_timeouts", "queue_max_total", "free_queue_share",
              "interactive_headroom_seconds", "interactive_headroom_max_share", "tenant_ceiling")
LIVE_KEYS = frozenset(PICK_KEYS + TABLE_KEYS + REGION_KEYS + OUTLIER_KEYS + RETRY_KEYS + QUEUE_KEYS)


def digest(text: str) -> str:
    """The sha256 hex of a config's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def parse(text: str) -> dict[str, Any]:
    """The ``[proxy]`` keys of ``text``; raises ConfigError naming the section or the key at fault."""
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise ConfigError("router.text", f"longer than {MAX_TEXT_BYTES} bytes")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("router.text", f"not TOML: {exc}") from None
    for name in data:
        if name != SECTION:
            raise ConfigError(name, f"a router config holds the [{SECTION}] section only")
    section = data.get(SECTION, {})
    if not isinstance(section, Mapping):
        raise ConfigError(SECTION, "must be a table")
    return check(section)


def check(section: Mapping[str, Any]) -> dict[str, Any]:
    """``section``'s keys checked to be live, their values TOML scalars or lists; raises ConfigError."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in LIVE_KEYS:
            raise ConfigError(f"{SECTION}.{key}", "needs a restart: not a key a router config may change live "
                                                  f"(live: {', '.join(sorted(LIVE_KEYS))})")
        if isinstance(value, Mapping):
            raise ConfigError(f"{SECTION}.{key}", "must be a value, not a table")
        out[key] = value
    return out
