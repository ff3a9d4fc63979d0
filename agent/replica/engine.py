"""A pure model of one LLM replica with continuous batching, driven by an injected clock.

The same object runs under the real-time replica (:mod:`agent.replica.runner`, which
sleeps each step's duration) and under a discrete-event fleet simulator in
virtual time: nothing here awaits, sleeps, reads a clock or draws a random
number. Time enters only as the ``now`` arguments (float seconds).

Model (iteration-level scheduling, as continuous-batching engines such as TensorRT-LLM do):

- **Admission** (:meth:`Engine.submit`): a request waits in a FIFO queue of
  at most ``max_queue`` entries; a full queue, or a request whose prompt plus
  ``max_tokens`` exceeds ``max_context_tokens`` or the whole KV cache, is
  refused with a :class:`SubmitOutcome` reason and nothing changes.
- **Scheduling** (:meth:`Engine.start_step`): requests move from the head of
  the queue into the running batch while there is a free slot (at most
  ``max_running``) and enough free KV blocks for their prompt plus
  ``max_tokens`` (blocks of ``kv_block_tokens`` tokens, reserved in full on
  admission, released on finish or cancel). The head blocks the queue (FIFO,
  no overtaking).
- **Prefix cache**: on admission, a request's chained block hashes are looked
  up in an LRU :class:`agent.replica.prefix_cache.PrefixCache` of
  ``prefix_cache_blocks`` hashes; its cached tokens are its leading hit blocks
  times the block size, capped at the prompt. Its blocks enter the cache when
  its prefill step ends.
- **Step time**: one step prefills prompt tokens (of requests admitted now or
  earlier) and decodes one token for every request whose prefill is done:
  ``prefill_base_seconds + prefill_seconds_per_token * prompt tokens
  prefilled in the step`` if anything is prefilled, plus ``decode_base_seconds +
  decode_seconds_per_request * decoding requests`` if anything decodes.
- **Chunked prefill**: a step prefills at most ``max_step_tokens`` uncached
  prompt tokens (0: no limit), oldest request first; a longer prompt is
  prefilled over several steps, interleaved with the batch's decoding, as
  TensorRT-LLM's chunked context and vLLM's chunked prefill do, so a 100 k-token
  prompt does not stall every running request for two seconds. A request
  emits its first token at the end of the step that finishes its prefill.
  New requests are admitted only while the step has prefill budget left.
- **End of step** (:meth:`Engine.finish_step`): the tokens of the step are
  delivered (one per request), first tokens flagged, requests that reached
  their length finish and free their blocks.
- **Counters** (:class:`EngineLoad`): besides steps and modelled busy time,
  the four quantities the step time is linear in, summed over finished steps:
  steps that prefilled, tokens prefilled, steps that decoded, requests decoding
  (so busy time = prefill_base x prefill steps + per_token x tokens prefilled +
  decode_base x decode steps + per_request x requests decoding, exactly),
  from which the control plane fits the four step parameters back
  (``controlplane.engines``).
- **Length**: a request generates :attr:`EngineRequest.output_tokens` tokens,
  the length of its answer as the replica's faces settle it beforehand (a
  natural end drawn from the prompt, a stop string, or ``max_tokens``:
  :mod:`agent.replica.answer`); 0 means ``max_tokens``. Admission checks
  prompt + ``max_tokens`` against the context (as vLLM does), but the KV
  reservation and the steps follow the real length.

Defaults (:class:`EngineParams`, section ``[replica]``), one large-model
replica: ``max_running`` 60, ``max_queue`` 1024, ``kv_block_tokens`` 512,
``kv_blocks_total`` 4096 (2 M tokens), ``prefix_cache_blocks`` 4096, prefill
2 ms + 20 µs per uncached token (a 10 k-token prompt: 0.2 s), decode 8 ms +
0.2 ms per running request (20 ms at 60: 50 tokens/s per request),
``max_context_tokens`` 131072.

``max_step_tokens`` 8192. ``answer_tokens`` 0 and ``answer_min_tokens`` 8
are read by the faces, not the engine (:mod:`agent.replica.answer`): with 0
every answer runs to ``max_tokens``, as the fleet simulator assumes.

Simplifications: a request's length is known at admission; no
preemption or swapping (blocks for the whole output are reserved up front,
as TensorRT-LLM's guaranteed-no-evict policy does for ``max_tokens``, here
for the real length, which is what a paged engine ends up holding, and a
request waits in the queue while the pool lacks them); the prefix cache is an index of
hashes beside the KV reservation rather than blocks taken out of it (an
engine that keeps reusable blocks in the free pool behaves alike until the
pool is full).

Cost: ``submit``/``cancel`` O(1) (a cancel of a queued request is O(queue));
``start_step`` O(admitted prompt blocks + running); ``finish_step`` O(running).
Memory bounded by ``max_queue + max_running`` requests and the cache capacity.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from collections.abc import Mapping

from agent.replica.prefix_cache import PrefixCache
from ferry.errors import ConfigError
from ferry.tokens import BLOCK_TOKENS, blocks_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineParams:
    """One replica's engine; defaults look like one large-model replica with 60 batch slots ([replica])."""

    max_running: int = 60
    max_queue: int = 1024
    kv_block_tokens: int = BLOCK_TOKENS
    kv_blocks_total: int = 4096
    prefix_cache_blocks: int = 4096
    prefill_base_seconds: float = 0.002
    prefill_seconds_per_token: float = 20e-6
    decode_base_seconds: float = 0.008
    decode_seconds_per_request: float = 0.0002
    max_context_tokens: int = 131072
    max_step_tokens: int = 8192
    # Read by the faces (agent.replica.answer), not the engine: the mean natural answer length in tokens
    # (0: every answer runs to max_tokens) and its floor.
    answer_tokens: int = 0
    answer_min_tokens: int = 8

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            least = 1 if f.name in _AT_LEAST_ONE else 0
            if value < least:
                raise ConfigError(f"replica.{f.name}", f"must be >= {least}, got {value}")


_AT_LEAST_ONE = ("max_running", "kv_block_tokens", "kv_blocks_total", "max_context_tokens", "answer_min_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """What the engine needs of a request: sizes and the prompt's chained block hashes.

    ``max_tokens`` is the budget the client asked for (checked against the context); ``output_tokens`` the
    tokens the request really generates, 1..``max_tokens`` (0: ``max_tokens``).
    """

    request_id: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: tuple[int, ...] = ()
    output_tokens: int = 0

    @property
    def length(self) -> int:
        """The tokens this request generates before it finishes."""
        return self.output_tokens or self.max_tokens


class SubmitOutcome(enum.StrEnum):
    """What :meth:`Engine.submit` did with a request: queued it, or refused it (queue full, or it can never fit)."""

    QUEUED = "queued"
    QUEUE_FULL = "queue_full"
    TOO_LONG = "too_long"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finished:
    """Summary of a request that generated all its tokens (``completion_tokens``: its length)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_seconds: float
    service_seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one step produced, known at its end."""

    tokens: Mapping[str, int]
    first: tuple[str, ...]
    finished: tuple[Finished, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineLoad:
    """A snapshot of the engine's load and counters since it started."""

    queued: int
    running: int
    context: int
    max_running: int
    kv_blocks_free: int
    kv_blocks_total: int
    kv_block_tokens: int
    completed: int
    cancelled: int
    rejected: int
    steps: int
    busy_seconds: float
    prefix_hit_blocks: int
    prefix_lookup_blocks: int
    # What the step-time model is linear in, summed over finished steps (docs/engine.md, "Counters"):
    prefill_steps: int = 0  # steps that prefilled (charged prefill_base_seconds)
    prefill_tokens: int = 0  # uncached prompt tokens prefilled (charged prefill_seconds_per_token each)
    decode_steps: int = 0  # steps that decoded (charged decode_base_seconds)
    decode_tokens: int = 0  # requests decoding, summed over steps (charged decode_seconds_per_request each)
    max_step_tokens: int = 0  # the chunked-prefill budget of a step (0: none)
    prefix_cache_blocks: int = 0  # blocks the prefix cache indexes at most


@dataclasses.dataclass(kw_only=True)
class _Active:
    """One admitted request inside the engine: its KV blocks, cached and emitted tokens, and prefill left."""

    req: EngineRequest
    submitted: float
    admitted: float = 0.0
    blocks: int = 0
    cached_tokens: int = 0
    emitted: int = 0
    to_prefill: int = 0  # uncached prompt tokens not yet prefilled


@dataclasses.dataclass(frozen=True)
class _Step:
    """One engine step in progress: when it started, how long it takes, the requests in it and those prefilling."""

    started: float
    duration: float
    ids: tuple[str, ...]
    prefill: frozenset[str]
    prefilled: int = 0  # uncached prompt tokens prefilled
    decoding: int = 0  # requests decoding


class Engine:
    """One replica's continuous-batching engine; see the module docstring for the model."""

    def __init__(self, params: EngineParams | None = None) -> None:
        self.params = params or EngineParams()
        self._queue: deque[_Active] = deque()
        self._running: dict[str, _Active] = {}
        self._ids: set[str] = set()
        self._cache = PrefixCache(self.params.prefix_cache_blocks)
        self._blocks_used = 0
        self._step: _Step | None = None
        self._completed = self._cancelled = self._rejected = self._steps = 0
        self._busy = 0.0
        self._hit_blocks = self._lookup_blocks = 0
        self._prefill_steps = self._prefill_tokens = self._decode_steps = self._decode_tokens = 0

    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        """KV blocks a request of ``max_tokens`` output tokens reserves: its prompt plus all its output."""
        return blocks_for(prompt_tokens + max_tokens, self.params.kv_block_tokens)

    def submit(self, req: EngineRequest, now: float) -> SubmitOutcome:
        """Queue ``req``; refused (nothing changes) when the queue is full or the request can never fit."""
        if req.prompt_tokens < 0 or req.max_tokens < 1 or not 0 <= req.output_tokens <= req.max_tokens:
            raise ValueError(f"request {req.request_id}: prompt_tokens >= 0, max_tokens >= 1 and "
                             "0 <= output_tokens <= max_tokens required")
        if req.request_id in self._ids:
            raise ValueError(f"request {req.request_id}: id already in the engine")
        p = self.params
        if (req.prompt_tokens + req.max_tokens > p.max_context_tokens
                or self.blocks_needed(req.prompt_tokens, req.length) > p.kv_blocks_total):
            self._rejected += 1
            return SubmitOutcome.TOO_LONG
        if len(self._queue) >= p.max_queue:
            self._rejected += 1
            return SubmitOutcome.QUEUE_FULL
        self._queue.append(_Active(req=req, submitted=now))
        self._ids.add(req.request_id)
        return SubmitOutcome.QUEUED

    def cancel(self, request_id: str) -> bool:
        """Drop a queued or running request and free its blocks; False when it is not here."""
        if request_id not in self._ids:
            return False
        self._ids.discard(request_id)
        self._cancelled += 1
        active = self._running.pop(request_id, None)
        if active is not None:
            self._blocks_used -= active.blocks
            return True
        self._queue = deque(a for a in self._queue if a.req.request_id != request_id)
        return True

    @property
    def step_in_flight(self) -> bool:
        """True between :meth:`start_step` and :meth:`finish_step`."""
        return self._step is not None

    @property
    def idle(self) -> bool:
        """Nothing queued, running or in a step."""
        return not self._queue and not self._running and self._step is None

    def start_step(self, now: float) -> float | None:
        """Schedule the next step at ``now``; its duration in seconds, or None when there is nothing to do."""
        if self._step is not None:
            raise RuntimeError("a step is already in flight; call finish_step first")
        p = self.params
        budget = p.max_step_tokens if p.max_step_tokens > 0 else 1 << 62
        decoding: list[str] = []
        completing: list[str] = []
        prefilled = 0
        for rid, active in self._running.items():  # admission order: the oldest prefill first
            if active.to_prefill <= 0:
                decoding.append(rid)
            elif budget > 0:
                take = min(active.to_prefill, budget)
                active.to_prefill -= take
                budget -= take
                prefilled += take
                if active.to_prefill <= 0:
                    completing.append(rid)
        admitted = False
        while self._queue and len(self._running) < p.max_running and budget > 0:
            head = self._queue[0]
            need = self.blocks_needed(head.req.prompt_tokens, head.req.length)
            if need > p.kv_blocks_total - self._blocks_used:
                break
            self._queue.popleft()
            hits = self._cache.lookup(head.req.block_hashes)
            self._hit_blocks += hits
            self._lookup_blocks += len(head.req.block_hashes)
            head.cached_tokens = min(hits * p.kv_block_tokens, head.req.prompt_tokens)
            head.blocks, head.admitted = need, now
            self._blocks_used += need
            self._running[head.req.request_id] = head
            admitted = True
            take = min(head.req.prompt_tokens - head.cached_tokens, budget)
            head.to_prefill = head.req.prompt_tokens - head.cached_tokens - take
            budget -= take
            prefilled += take
            if head.to_prefill <= 0:
                completing.append(head.req.request_id)
        if not decoding and not completing and not prefilled and not admitted:
            return None
        duration = 0.0
        if prefilled or completing:
            duration += p.prefill_base_seconds + p.prefill_seconds_per_token * prefilled
        if decoding:
            duration += p.decode_base_seconds + p.decode_seconds_per_request * len(decoding)
        self._step = _Step(now, duration, (*decoding, *completing), frozenset(completing), prefilled, len(decoding))
        return duration

    def finish_step(self, now: float) -> StepResult:
        """End the step in flight at ``now``: one token per request still running, first tokens, finished ones."""
        step = self._step
        if step is None:
            raise RuntimeError("no step in flight; call start_step first")
        self._step = None
        self._steps += 1
        self._busy += step.duration
        if step.prefilled or step.prefill:
            self._prefill_steps += 1
            self._prefill_tokens += step.prefilled
        if step.decoding:
            self._decode_steps += 1
            self._decode_tokens += step.decoding
        tokens: dict[str, int] = {}
        first: list[str] = []
        finished: list[Finished] = []
        for rid in step.ids:
            active = self._running.get(rid)
            if active is None:  # cancelled during the step
                continue
            active.emitted += 1
            tokens[rid] = 1
            if rid in step.prefill:
                first.append(rid)
                self._cache.insert(active.req.block_hashes)
            if active.emitted >= active.req.length:
                del self._running[rid]
                self._ids.discard(rid)
                self._blocks_used -= active.blocks
                self._completed += 1
                finished.append(Finished(
                    request_id=rid, prompt_tokens=active.req.prompt_tokens, cached_tokens=active.cached_tokens,
                    completion_tokens=active.emitted, queue_seconds=active.admitted - active.submitted,
                    service_seconds=now - active.admitted,
                ))
        return StepResult(tokens=tokens, first=tuple(first), finished=tuple(finished))

    def load(self) -> EngineLoad:
        """A snapshot of queue, batch, KV cache and counters."""
        p = self.params
        return EngineLoad(
            queued=len(self._queue), running=len(self._running),
            context=len(self._step.prefill) if self._step else 0, max_running=p.max_running,
            kv_blocks_free=p.kv_blocks_total - self._blocks_used, kv_blocks_total=p.kv_blocks_total,
            kv_block_tokens=p.kv_block_tokens, completed=self._completed, cancelled=self._cancelled,
            rejected=self._rejected, steps=self._steps, busy_seconds=self._busy,
            prefix_hit_blocks=self._hit_blocks, prefix_lookup_blocks=self._lookup_blocks,
            prefill_steps=self._prefill_steps, prefill_tokens=self._prefill_tokens,
            decode_steps=self._decode_steps, decode_tokens=self._decode_tokens, max_step_tokens=p.max_step_tokens,
            prefix_cache_blocks=p.prefix_cache_blocks,
        )
