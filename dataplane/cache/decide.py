"""Whether a model's response cache is on: the measured duplicate rate against thresholds, with hysteresis.

:func:`decide` is pure. Parameters (:class:`CachePolicy`, from the ``[proxy]``
``cache_*`` keys): ``enable_above`` (the duplicate share, 0..1, above which a
cache that is off turns on), ``disable_below`` (at most ``enable_above``: a
cache that is on turns off only when the share falls below it, so a rate
hovering at the threshold does not flap), ``min_requests`` (deterministic
requests in the window below which the evidence is too thin and the state
stays as it is: a new model starts off). ``mode`` ``off`` keeps every cache
off and measures only.

The share is duplicates / deterministic requests over the sliding window
(:mod:`dataplane.cache.measure`), summed over the model's tenants: a cache is
per tenant, so only a tenant's own repeats count, which is what the
measurement counts.
"""

from __future__ import annotations

import dataclasses

MODES = ("auto", "off")


@dataclasses.dataclass(frozen=True, slots=True)
class CachePolicy:
    """The thresholds of :func:`decide`; see the module docstring."""

    enable_above: float = 0.05
    disable_below: float = 0.03
    min_requests: int = 200
    mode: str = "auto"


def share(deterministic: int, duplicates: int) -> float:
    """Duplicates / deterministic requests, 0..1 (0 with none)."""
    return min(1.0, duplicates / deterministic) if deterministic > 0 else 0.0


def decide(on: bool, deterministic: int, duplicates: int, policy: CachePolicy) -> bool:
    """The cache's next state from its current one and the window's counts (hysteresis; module docstring)."""
    if policy.mode == "off":
        return False
    if deterministic < policy.min_requests:
        return on
    rate = share(deterministic, duplicates)
    return rate >= policy.disable_below if on else rate > policy.enable_above
