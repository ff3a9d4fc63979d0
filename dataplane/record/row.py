"""Which requests are recorded, and the row of one: pure.

**Sampling.** A request is recorded when ``crc32(request_id) < rate x 2^32``
(:class:`Sampler`): one C call over a short string, deterministic, so a
request is recorded or not wherever it is looked at, and the same id is
recorded alike on every proxy. Rate 1 records all and rate 0 none without
hashing.

**The tenant.** :func:`tenant_hash` is the first 16 hex characters (64 bits)
of ``sha256(b"ferry-tenant" 0x00 name)``: a fixed label, no per-proxy salt, so
one tenant hashes alike on every proxy and in every export, and a tenant's
rows can be told apart without its name being written anywhere. (Someone who
already knows a tenant's name can recognise its hash: the hash hides names
from a reader of the export, not from an operator who has the tenant list.)

**The row** (:func:`row_of`): arrival in unix seconds (the wall clock at the
end less the request's duration), model, tier, tenant hash, prompt, output
and cached tokens, ``max_tokens`` as admitted, the prompt's chained 512-token
block hashes (``ValidRequest.prefix_hashes``: for a recorded request every
block of the prompt, up to ``record_max_blocks``, 4,096: the decision's own
exact hashes of its deepest prefix depth, 16 blocks, then sketch hashes
(:func:`ferry.tokens.sketch_hashes`); none when the client gave a
``prefix_key``), the time to the first token (absent when not
known: a failure, or the picker, which never sees a token), the time to the
end, the replica that served last and the branch of its decision, the status
counted, whether the client asked for a stream. The proxy's id and region
are filled in by the control plane from the watch the row came on.

Cost: one CRC-32 per request when ``0 < rate < 1``; per recorded request, one
``TrafficRow`` built (about 2 µs; ``python -m tools.bench.recorder``).
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from typing import Protocol

from dataplane.forward.kserve import Outcome
from dataplane.intake.validate import ValidRequest
from ferry.config import TenantConfig
from ferry.v1 import tables_pb2


class Finished(Protocol):
    """What a row is made of: the fields of :class:`dataplane.router.RequestState` it reads."""

    @property
    def request_id(self) -> str: ...
    @property
    def model_label(self) -> str: ...
    @property
    def tier_label(self) -> str: ...
    @property
    def tenant(self) -> TenantConfig | None: ...
    @property
    def request(self) -> ValidRequest | None: ...
    @property
    def outcome(self) -> Outcome: ...
    @property
    def replica_id(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def streamed(self) -> bool: ...


TENANT_LABEL = b"ferry-tenant\x00"
TENANT_HEX = 16
MAX_TOKENS = 2**32 - 1


@functools.lru_cache(maxsize=4096)
def tenant_hash(name: str) -> str:
    """The tenant's 16-hex-character hash (the module docstring); "" for no tenant."""
    if not name:
        return ""
    return hashlib.sha256(TENANT_LABEL + name.encode()).hexdigest()[:TENANT_HEX]


class Sampler:
    """Records ``rate`` of the requests, by a CRC-32 of their id (the module docstring)."""

    __slots__ = ("every", "never", "rate", "threshold")

    def __init__(self, rate: float) -> None:
        if not 0 <= rate <= 1:
            raise ValueError("rate must be 0..1")
        self.rate = rate
        self.every = rate >= 1
        self.never = rate <= 0
        self.threshold = int(rate * 2**32)

    def sampled(self, request_id: str) -> bool:
        """Whether the request of ``request_id`` is recorded."""
        if self.every:
            return True
        return not self.never and zlib.crc32(request_id.encode()) < self.threshold


def _count(value: int) -> int:
    return value if 0 <= value <= MAX_TOKENS else (0 if value < 0 else MAX_TOKENS)


def row_of(state: Finished, status: str, elapsed: float, arrival: float) -> tables_pb2.TrafficRow:
    """The row of a request that ended with gRPC status ``status`` after ``elapsed`` seconds, having arrived
    at ``arrival`` (unix seconds)."""
    valid, outcome, tenant = state.request, state.outcome, state.tenant
    row = tables_pb2.TrafficRow(
        arrival=arrival, model=state.model_label, tier=state.tier_label,
        tenant=tenant_hash(tenant.name) if tenant is not None else "",
        prompt_tokens=_count(outcome.prompt_tokens or (valid.prompt_tokens if valid is not None else 0)),
        completion_tokens=_count(outcome.completion_tokens), cached_tokens=_count(outcome.cached_tokens),
        max_tokens=_count(valid.max_tokens) if valid is not None else 0,
        hash_ids=valid.prefix_hashes if valid is not None else (),
        e2e_seconds=max(elapsed, 0.0), replica_id=state.replica_id, branch=state.branch, outcome=status,
        streamed=state.streamed)
    if status == "OK" and outcome.ttft_seconds > 0:
        row.ttft_seconds = outcome.ttft_seconds
    return row
