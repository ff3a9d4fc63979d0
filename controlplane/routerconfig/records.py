"""Router config versions and the router rollout: the store records, the assignment, the table's part (pure).

**Config versions** live under ``/ferry/intent/router/config/{version}``
(the version zero-padded to 20 digits, so keys sort by version) as JSON
``{"version", "text", "digest", "created_at"}``: the TOML text of a
``[proxy]`` section of live keys (:mod:`ferry.routerconfig`), its sha256,
unix seconds. Version 0 is no record: each proxy's own file. At most
:data:`MAX_CONFIGS` (32) are kept; storing one more deletes the oldest that
no rollout names.

**The rollout** (the latest one; one at a time) lives under
``/ferry/intent/router/rollout`` as JSON ``{"id", "baseline", "candidate",
"share", "guard": {...}, "state", "reason", "started_at", "updated_at",
"decided_at"}``: the versions, the canary share of each region's proxies
(0..1), the guard (:class:`controlplane.routerconfig.guard.Guard`), the state
``canary`` | ``promoted`` | ``rolled_back`` | ``aborted``, why it got there,
unix seconds. The default version (what every proxy outside a canary runs)
follows from it: the candidate once promoted, else the baseline.

**Assignment** (:func:`assign`): in each region, the proxies watching are
ordered by the sha256 of their id, and the first ``ceil(share x n)`` run the
candidate, the others the baseline: deterministic, and a proxy that joins or
leaves moves at most the proxies around its place in that order (two proxies
at 50 %: exactly one canary). :func:`router_part` fills a table's
``router_configs``, ``router_assignments`` (the canary proxies, by id) and
``router_default``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.routerconfig.guard import Guard
from controlplane.store.base import INTENT_PREFIX
from ferry.v1 import tables_pb2

ROUTER_PREFIX = INTENT_PREFIX + "router/"
CONFIG_PREFIX = ROUTER_PREFIX + "config/"
ROLLOUT_KEY = ROUTER_PREFIX + "rollout"
MAX_CONFIGS = 32

CANARY = "canary"
PROMOTED = "promoted"
ROLLED_BACK = "rolled_back"
ABORTED = "aborted"
STATES = (CANARY, PROMOTED, ROLLED_BACK, ABORTED)


def config_key(version: int) -> str:
    return f"{CONFIG_PREFIX}{version:020d}"


@dataclasses.dataclass(frozen=True, slots=True)
class RouterConfig:
    """One stored version."""

    version: int
    text: str
    digest: str
    created_at: float

    def encode(self) -> bytes:
        return json.dumps({"version": self.version, "text": self.text, "digest": self.digest,
                           "created_at": self.created_at}, sort_keys=True).encode()

    @classmethod
    def decode(cls, key: str, data: bytes) -> RouterConfig:
        """A record read from ``key``; ``ValueError`` naming the key and field."""
        raw = _object(key, data)
        version, text, digest, created = raw.get("version"), raw.get("text"), raw.get("digest"), raw.get("created_at")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1 or config_key(version) != key:
            raise ValueError(f"{key}: version must be the key's, >= 1")
        if not isinstance(text, str) or not isinstance(digest, str):
            raise ValueError(f"{key}: text and digest must be strings")
        return cls(version, text, digest, _number(key, "created_at", created))


@dataclasses.dataclass(frozen=True, slots=True)
class RouterRollout:
    """The latest rollout; see the module docstring."""

    id: int
    baseline: int
    candidate: int
    share: float
    guard: Guard
    state: str
    reason: str
    started_at: float
    updated_at: float
    decided_at: float = 0.0

    @property
    def default_version(self) -> int:
        """What a proxy outside the canary runs."""
        return self.candidate if self.state == PROMOTED else self.baseline

    def decided(self, state: str, reason: str, now: float) -> RouterRollout:
        return dataclasses.replace(self, state=state, reason=reason, updated_at=now, decided_at=now)

    def encode(self) -> bytes:
        return json.dumps({"id": self.id, "baseline": self.baseline, "candidate": self.candidate,
                           "share": self.share, "guard": dataclasses.asdict(self.guard), "state": self.state,
                           "reason": self.reason, "started_at": self.started_at, "updated_at": self.updated_at,
                           "decided_at": self.decided_at}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> RouterRollout:
        """The record read from :data:`ROLLOUT_KEY`; ``ValueError`` naming the field."""
        key = ROLLOUT_KEY
        raw = _object(key, data)
        ints = {}
        for name in ("id", "baseline", "candidate"):
            value = raw.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{key}: {name} must be an integer >= 0")
            ints[name] = value
        share = _number(key, "share", raw.get("share"))
        if not 0.0 < share <= 1.0:
            raise ValueError(f"{key}: share must be in (0, 1]")
        state, reason = raw.get("state"), raw.get("reason", "")
        if state not in STATES or not isinstance(reason, str):
            raise ValueError(f"{key}: state must be one of {', '.join(STATES)}, reason a string")
        given = raw.get("guard")
        if not isinstance(given, dict):
            raise ValueError(f"{key}: guard must be an object")
        names = {f.name for f in dataclasses.fields(Guard)}
        try:
            guard = Guard(**{k: v for k, v in given.items() if k in names}).check()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{key}: {exc}") from None
        return cls(ints["id"], ints["baseline"], ints["candidate"], share, guard, str(state), reason,
                   _number(key, "started_at", raw.get("started_at")),
                   _number(key, "updated_at", raw.get("updated_at")),
                   _number(key, "decided_at", raw.get("decided_at", 0.0)))


def _object(key: str, data: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{key}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{key}: not a JSON object")
    return raw


def _number(key: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key}: {name} must be a finite number")
    return float(value)


def rank(proxy_id: str) -> bytes:
    """A proxy's place in the assignment order."""
    return hashlib.sha256(proxy_id.encode()).digest()


def canaries(proxy_ids: Iterable[str], share: float) -> list[str]:
    """The proxies of one region that run the candidate: the first ``ceil(share x n)`` by :func:`rank`."""
    ordered = sorted(set(proxy_ids), key=rank)
    count = min(len(ordered), math.ceil(share * len(ordered) - 1e-9)) if share > 0 else 0
    return sorted(ordered[:count])


def assign(rollout: RouterRollout | None, proxies_by_region: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Region -> the proxies that run the candidate (none unless the rollout is in canary)."""
    if rollout is None or rollout.state != CANARY:
        return {region: [] for region in proxies_by_region}
    return {region: canaries(ids, rollout.share) for region, ids in proxies_by_region.items()}


def router_part(table: tables_pb2.TableSnapshot, rollout: RouterRollout | None, canary_ids: Iterable[str],
                configs: Mapping[int, RouterConfig]) -> None:
    """Fill ``table``'s router configs, assignments and default (see the module docstring)."""
    default = rollout.default_version if rollout is not None else 0
    named = sorted(canary_ids)
    versions = {default} | ({rollout.candidate} if rollout is not None and named else set())
    for version in sorted(v for v in versions if v and v in configs):
        config = configs[version]
        table.router_configs.add(version=version, text=config.text, digest=config.digest)
    if named and rollout is not None:
        table.router_assignments.extend(tables_pb2.RouterAssignment(proxy_id=pid, version=rollout.candidate)
                                        for pid in named)
    table.router_default = default
