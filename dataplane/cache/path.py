"""Where the request path meets the response cache: lookup, replay, tape and store, and the metrics.

:class:`CachePath` composes the pure parts (:mod:`dataplane.cache.measure`,
:mod:`dataplane.cache.decide`, :mod:`dataplane.cache.store`) for
:class:`dataplane.router.Router`, which calls it at one place per path:

- unary (``Router.infer``): :meth:`CachePath.lookup` after the prompt
  hooks and before the tier queue (a hit is the answer, checked by the
  output hooks like any), :meth:`CachePath.store` after a success, with the
  answer as the replica gave it;
- stream (``Router._stream``, inside the guardrails' windows):
  :meth:`CachePath.replay` before the tier queue (a hit yields the stored
  pieces, so the chunking is the original one), :meth:`CachePath.tape`
  records the pieces delivered (when the cache was on as the stream began),
  :meth:`CachePath.store` after the stream completes.

Only *deterministic* requests take part: temperature 0 or a seed given
(:func:`deterministic`); a request without them may answer differently each
time and is neither measured nor cached. The payload is exact
(:func:`payload_digest`): tenant, model, the version the table resolved,
prompt bytes, every sampling parameter given, max_tokens.

Every completed deterministic request (and every hit) is measured; the
model's decision (:func:`dataplane.cache.decide.decide`) is taken again
after each, and the cache serves and stores a model's answers only while
it is on. A table that no longer routes a version drops that version's
answers (:meth:`CachePath.apply_table`). :meth:`CachePath.samples` is the
report's ``cache`` rows (``tables_pb2.Report.cache``).

Metrics (bounded labels: model): ``ferry_proxy_cache_enabled`` (1 while on),
``ferry_proxy_cache_duplicate_share`` (the window's share, 0..1),
``ferry_proxy_cache_hits_total``, ``ferry_proxy_cache_saved_seconds_total``
(replica seconds the hits saved), ``ferry_proxy_cache_entries`` and
``ferry_proxy_cache_bytes``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from dataplane.cache.decide import CachePolicy, decide, share
from dataplane.cache.measure import DuplicateMeter
from dataplane.cache.store import Answer, ResponseCache
from dataplane.forward.kserve import Outcome, Piece
from ferry.metrics import name
from ferry.sampling import SamplingValue
from ferry.v1 import tables_pb2

if TYPE_CHECKING:
    from dataplane.cache.settings import CacheSettings
    from dataplane.table.local import Table
    from ferry.config import TenantConfig


class Payload(Protocol):
    """What the cache reads of a validated request (:class:`dataplane.intake.validate.ValidRequest`)."""

    @property
    def model(self) -> str:
        """The model named."""

    @property
    def prompt(self) -> bytes:
        """The prompt's bytes."""

    @property
    def max_tokens(self) -> int:
        """The most tokens to generate."""

    @property
    def sampling(self) -> tuple[tuple[str, SamplingValue], ...]:
        """The sampling parameters given, in field order."""


class RequestState(Protocol):
    """What the cache reads and fills of a request (:class:`dataplane.router.RequestState`)."""

    @property
    def request(self) -> Payload | None:
        """The validated request (None before validation)."""

    tenant: TenantConfig | None
    version: str
    model_label: str
    outcome: Outcome
    replica_id: str


def deterministic(request: Payload) -> bool:
    """Temperature 0 or a seed given: the same payload gives the same answer."""
    given = dict(request.sampling)
    return given.get("temperature") == 0 or "seed" in given


def payload_digest(tenant: str, request: Payload, version: str) -> bytes:
    """SHA-256 of the exact payload: tenant, model, version, prompt, sampling parameters, max_tokens
    (each length-prefixed, so no two payloads share an encoding)."""
    h = hashlib.sha256()
    for part in (tenant.encode(), request.model.encode(), version.encode(), request.prompt,
                 repr(request.sampling).encode(), str(request.max_tokens).encode()):
        h.update(struct.pack("<I", len(part)))
        h.update(part)
    return h.digest()


class Tape:
    """The pieces a stream delivered, kept in order for the cache, up to ``limit`` bytes (then dropped)."""

    __slots__ = ("bytes", "limit", "pieces")

    def __init__(self, limit: int) -> None:
        self.pieces: list[tuple[str, int]] | None = [] if limit > 0 else None
        self.bytes = 0
        self.limit = limit

    def add(self, piece: Piece) -> None:
        """Record one delivered piece (a no-op once over the limit, or when not recording)."""
        if self.pieces is None:
            return
        self.bytes += len(piece.text) + 64
        if self.bytes > self.limit:
            self.pieces = None
            return
        self.pieces.append((piece.text, piece.tokens))


_OFF = Tape(0)


class CachePath:
    """The measurement, the decisions and the cache of one proxy; see the module docstring."""

    def __init__(self, settings: CacheSettings, *, clock: Callable[[], float],
                 registry: CollectorRegistry | None) -> None:
        self._clock = clock
        self.policy: CachePolicy = settings.policy()
        self.meter = DuplicateMeter(window=settings.cache_window_seconds, capacity=settings.cache_sketch_hashes,
                                    max_rows=settings.cache_max_rows)
        self.cache = ResponseCache(max_entries=settings.cache_max_entries, max_bytes=settings.cache_max_bytes,
                                   ttl=settings.cache_ttl_seconds)
        self.on: dict[str, bool] = {}  # model -> the cache is on (models of the table only)
        reg = {"registry": registry} if registry is not None else {}
        self._enabled = Gauge(name("proxy_cache_enabled"), "1 while the response cache is on for the model.",
                              ["model"], **reg)
        self._share = Gauge(name("proxy_cache_duplicate_share"),
                            "Share of the model's deterministic requests that repeated a payload in the window.",
                            ["model"], **reg)
        self._hits = Counter(name("proxy_cache_hits_total"), "Requests answered from the response cache.",
                             ["model"], **reg)
        self._saved = Counter(name("proxy_cache_saved_seconds_total"),
                              "Replica service seconds the cache's answers saved.", ["model"], **reg)
        self._entries = Gauge(name("proxy_cache_entries"), "Answers in the response cache.", **reg)
        self._bytes = Gauge(name("proxy_cache_bytes"), "Bytes counted against the response cache's bound.", **reg)

    def enabled(self, model: str) -> bool:
        """The cache is on for ``model``."""
        return self.on.get(model, False)

    def _key(self, state: RequestState) -> bytes | None:
        valid, tenant = state.request, state.tenant
        if valid is None or tenant is None or not state.version or not deterministic(valid):
            return None
        return payload_digest(tenant.name, valid, state.version)

    def _measured(self, model: str, tenant: str, key: bytes, now: float, seconds: float, *, hit: bool) -> None:
        """Count one completed request and take the model's decision again."""
        self.meter.observe(model, tenant, int.from_bytes(key[:8], "little"), now, seconds=seconds, hit=hit)
        totals = self.meter.model_totals(model, now)
        on = decide(self.on.get(model, False), totals.deterministic, totals.duplicates, self.policy)
        self.on[model] = on  # models of the table only: a request names one the table has
        self._enabled.labels(model).set(1 if on else 0)
        self._share.labels(model).set(share(totals.deterministic, totals.duplicates))

    def _hit(self, state: RequestState, stream: bool) -> Answer | None:
        """The cached answer of this request, counted as a hit; None on a miss or when the cache is off."""
        if not self.enabled(state.model_label):
            return None
        key = self._key(state)
        if key is None or state.tenant is None:
            return None
        now = self._clock()
        answer = self.cache.get(key, tenant=state.tenant.name, model=state.model_label, version=state.version,
                                now=now, stream=stream)
        if answer is None:
            return None
        self._measured(state.model_label, state.tenant.name, key, now, answer.service_seconds, hit=True)
        self._hits.labels(state.model_label).inc()
        self._saved.labels(state.model_label).inc(answer.service_seconds)
        state.outcome = Outcome(text=answer.text, prompt_tokens=answer.prompt_tokens,
                                completion_tokens=answer.completion_tokens, completion_reported=True,
                                finish_reason=answer.finish_reason)
        state.replica_id = ""
        return answer

    def lookup(self, state: RequestState) -> Outcome | None:
        """A unary request's answer from the cache (also in ``state.outcome``), or None."""
        answer = self._hit(state, stream=False)
        return state.outcome if answer is not None else None

    def replay(self, state: RequestState) -> list[Piece] | None:
        """A stream's pieces from the cache, as first delivered (``state.outcome`` filled), or None."""
        answer = self._hit(state, stream=True)
        if answer is None or answer.pieces is None:
            return None
        return [Piece(text, tokens) for text, tokens in answer.pieces]

    def tape(self, state: RequestState) -> Tape:
        """Where a stream records its pieces for :meth:`store` (a no-op tape unless it may be cached)."""
        if state.request is None or not deterministic(state.request) or not self.enabled(state.model_label):
            return _OFF
        return Tape(self.cache.max_bytes // 8)

    def store(self, state: RequestState, tape: Tape | None = None) -> None:
        """A request completed: measure it and, while the model's cache is on, keep its answer."""
        key = self._key(state)
        if key is None or state.tenant is None:
            return
        now = self._clock()
        outcome = state.outcome
        self._measured(state.model_label, state.tenant.name, key, now, outcome.service_seconds, hit=False)
        if not self.enabled(state.model_label):
            return
        if tape is not None and tape.pieces is None:
            return  # a stream whose pieces were not all kept cannot be replayed with its chunking
        pieces = tuple(tape.pieces) if tape is not None and tape.pieces is not None else None
        self.cache.put(key, Answer(
            tenant=state.tenant.name, model=state.model_label, version=state.version, text=outcome.text,
            prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens,
            finish_reason=outcome.finish_reason, service_seconds=outcome.service_seconds, pieces=pieces), now)
        self._gauges()

    def _gauges(self) -> None:
        self._entries.set(len(self.cache))
        self._bytes.set(self.cache.bytes)

    def apply_table(self, table: Table) -> None:
        """A table was applied: drop the answers of versions it no longer routes, and of models it dropped."""
        for model in self.cache.models():
            entry = table.models.get(model)
            versions = set(entry.by_version) | {entry.default_version} if entry is not None else set()
            self.cache.invalidate(model, versions)
        for model in [m for m in self.on if m not in table.models]:
            del self.on[model]
            self._enabled.remove(model)
            self._share.remove(model)
        self._gauges()

    def samples(self) -> list[tables_pb2.CacheSample]:
        """The measurement's rows for the usage report (``Report.cache``)."""
        return self.meter.samples(self._clock(), self.enabled)
