"""Model version rollout: the operator's record and the table weights it implies (pure: no I/O, no clock).

A rollout moves the requests of a model that name no version from a
*stable* version to a *canary* version in three steps an operator takes
(``ferryctl rollout``): a canary share, then promote (everything to the
canary, which becomes the default) or roll back (everything to the stable
one). Requests that name a version are never moved.

The record (:class:`Rollout`) lives in the store under
``/ferry/intent/rollout/{model}`` as JSON ``{"model", "stable", "canary",
"weight", "state", "updated_at"}`` (``weight``: the canary share asked for,
0..1; ``state``: ``canary`` | ``promoted`` | ``rolled_back``; ``updated_at``:
unix seconds).

:func:`transition` is the step (validation names the field: ``model``,
``version``, ``canary_percent``, ``action``):

- canary V at P % (P in 0..100): the stable version is the one the model
  serves by default now (the catalog's default, or the canary of a promoted
  rollout, or the stable one of a rolled-back rollout); V must differ from
  it. During a canary, a new canary version or share keeps the stable one.
- promote / roll back: of an existing rollout (``NotFound`` otherwise); a
  version, when given, must be its canary. Both are idempotent, and either
  may follow the other (roll back after a promote returns to the old version).

:func:`route_weights` turns a record and the versions that have a routable
replica in a region into that region's ``(default_version, weights)``:

============  ==================  ==============================================================
state         default version     weights
============  ==================  ==============================================================
canary        stable              stable 1 - w, canary w, while the canary has a routable
                                  replica (w > 0); else stable 1: a canary with no ready replica
                                  costs nothing, and its share grows as its replicas get ready
promoted      canary              canary 1; a region where the canary has no routable replica
                                  while the stable one has keeps the stable one (stable 1), so a
                                  promote never strands requests
rolled_back   stable              stable 1 (never the canary, whatever is ready)
============  ==================  ==============================================================

The proxies split the requests that name no version by these weights over
the versions with a routable replica (``dataplane.table.local``). Replicas of a
version that lost its weight stay in the table for requests that name it and
for the streams they run: nothing is cut, they simply get no new unversioned
requests. :func:`canary_share` is the share the canary gets under a given
table route, as a proxy computes it.

Cost: O(1) per transition, O(versions) per model route.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from controlplane.validate import check_name
from ferry.errors import InvalidArgument, NotFound

CANARY = "canary"
PROMOTED = "promoted"
ROLLED_BACK = "rolled_back"
STATES = (CANARY, PROMOTED, ROLLED_BACK)


class Action(enum.Enum):
    """What an operator asks of a rollout."""

    CANARY = "canary"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class Rollout:
    """One model's rollout: from ``stable`` to ``canary``, ``weight`` (0..1) the canary share asked for."""

    model: str
    stable: str
    canary: str
    weight: float
    state: str
    updated_at: float

    @property
    def default_version(self) -> str:
        """The version requests naming none get by default (before the per-region fallback)."""
        return self.canary if self.state == PROMOTED else self.stable

    def encode(self) -> bytes:
        """The store value (JSON)."""
        return json.dumps({"model": self.model, "stable": self.stable, "canary": self.canary,
                           "weight": self.weight, "state": self.state, "updated_at": self.updated_at},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, model: str, data: bytes) -> Rollout:
        """A record read from ``intent/rollout/{model}``; ``ValueError`` naming the key and field."""
        where = f"intent/rollout/{model}"
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: not a JSON object")
        fields: dict[str, str] = {}
        for key in ("model", "stable", "canary", "state"):
            value = raw.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: {key} must be a non-empty string")
            fields[key] = value
        if fields["model"] != model:
            raise ValueError(f"{where}: model {fields['model']!r} differs from the key")
        if fields["state"] not in STATES:
            raise ValueError(f"{where}: state {fields['state']!r} is not one of {', '.join(STATES)}")
        weight, updated_at = raw.get("weight"), raw.get("updated_at", 0.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 <= weight <= 1.0:
            raise ValueError(f"{where}: weight must be a number in 0..1")
        if isinstance(updated_at, bool) or not isinstance(updated_at, int | float) or not math.isfinite(updated_at):
            raise ValueError(f"{where}: updated_at must be a finite number")
        return cls(model, fields["stable"], fields["canary"], float(weight), fields["state"], float(updated_at))


def check_percent(percent: float) -> float:
    """The canary share (0..1) of a percentage; ``InvalidArgument`` naming ``canary_percent`` otherwise."""
    if not math.isfinite(percent) or not 0.0 <= percent <= 100.0:
        raise InvalidArgument("canary_percent", f"{percent} is not a number in 0..100")
    return percent / 100.0


def serving_default(current: Rollout | None, catalog_default: str) -> str:
    """The version a model serves by default now: its rollout's, else the catalog's."""
    return current.default_version if current is not None else catalog_default


def transition(
    current: Rollout | None,
    *,
    model: str,
    action: Action,
    version: str,
    percent: float,
    catalog_default: str,
    now: float,
    max_name_bytes: int = 128,
    max_version_bytes: int = 64,
) -> Rollout:
    """The record after ``action``; raises ``InvalidArgument`` (naming the field) or ``NotFound``."""
    check_name(model, "model", max_name_bytes)
    if action is Action.CANARY:
        check_name(version, "version", max_version_bytes)
        weight = check_percent(percent)
        stable = current.stable if current is not None and current.state == CANARY else serving_default(
            current, catalog_default)
        if version == stable:
            raise InvalidArgument("version", f"{version!r} is already the stable version of {model!r}: "
                                             "name the new version")
        return Rollout(model, stable, version, weight, CANARY, now)
    if current is None:
        raise NotFound("rollout", model)
    if version and version != current.canary:
        raise InvalidArgument("version", f"the rollout of {model!r} is to {current.canary!r}, not {version!r}")
    state = PROMOTED if action is Action.PROMOTE else ROLLED_BACK
    if current.state == state:
        return current
    return replace(current, state=state, updated_at=now)


def route_weights(record: Rollout, routable: AbstractSet[str]) -> tuple[str, list[tuple[str, float]]]:
    """(default version, [(version, weight > 0)]) of a region whose routable versions are ``routable``."""
    stable, canary = record.stable, record.canary
    if record.state == ROLLED_BACK:
        return stable, [(stable, 1.0)]
    if record.state == PROMOTED:
        if canary not in routable and stable in routable:
            return canary, [(stable, 1.0)]
        return canary, [(canary, 1.0)]
    w = record.weight
    if canary not in routable or w <= 0.0:
        return stable, [(stable, 1.0)]
    if w >= 1.0:
        return stable, [(canary, 1.0)]
    return stable, [(stable, 1.0 - w), (canary, w)]


def canary_share(weights: Sequence[tuple[str, float]], default: str, routable: AbstractSet[str],
                 canary: str) -> float:
    """The share of requests naming no version that go to ``canary`` under a table route (as a proxy splits)."""
    live = [(v, w) for v, w in weights if w > 0 and v in routable]
    total = sum(w for _, w in live)
    if total > 0:
        return sum(w for v, w in live if v == canary) / total
    return 1.0 if default == canary and canary in routable else 0.0
