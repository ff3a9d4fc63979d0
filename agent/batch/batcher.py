"""Size-or-time batcher with plan-then-tenant fill order (pure: no I/O, no clock).

Flush rule (:meth:`Batcher.due`): a batch is due when the pending requests
reach ``max_batch`` (reason ``size``) or when the oldest has waited
``max_wait_s`` (reason ``time``); requests put back after a GPU failure are
overdue by construction and make the batcher due at once (reason ``retry``).
The caller takes a batch only when a GPU is free, so under load a batch keeps
filling while it waits for one.

Fill order (:meth:`Batcher.take`): first the retry lane (requests whose GPU
died, at the head, in their old order), then plans in ``plans`` order
(default enterprise, paid, free), and within a plan one request per tenant in
turn; the turn carries over from one batch to the next.

Bound: at most ``max_pending`` requests wait (the retry lane excepted: it
holds only what was in flight, at most a batch per GPU). When full, a request
evicts the newest request of the busiest tenant of a lower plan (that one
gets :class:`QueueFull`), or is refused with :class:`QueueFull` itself, which
the server maps to RESOURCE_EXHAUSTED.

Defaults: ``max_batch`` 100, ``max_wait_s`` 0.05 (see :mod:`agent.batch.budget`),
``max_pending`` 2,000. Cost: push, take and due are O(1) amortised per
request; removal (cancellation) is O(requests of that tenant).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Literal

from ferry.errors import ConfigError, InvalidArgument, Overloaded

FlushReason = Literal["size", "time", "retry"]
FLUSH_REASONS: tuple[FlushReason, ...] = ("size", "time", "retry")
PLAN_ORDER = ("enterprise", "paid", "free")


class QueueFull(Overloaded):
    """The model's pending queue is at its limit (RESOURCE_EXHAUSTED at the boundary)."""

    def __init__(self, model: str, limit: int, retry_after: float) -> None:
        super().__init__(f"model {model!r}: {limit} requests pending", retry_after)
        self.model = model
        self.limit = limit


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the batcher: its id, who sent it, when it arrived, how often it was tried."""

    rid: int
    tenant: str
    plan: str
    arrival: float
    attempts: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatcherConfig:
    """Limits of one model's batcher."""

    max_batch: int = 100
    max_wait_s: float = 0.05
    max_pending: int = 2000
    plans: tuple[str, ...] = PLAN_ORDER
    retry_after_s: float = 0.1

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ConfigError("max_batch", "must be at least 1")
        if self.max_wait_s < 0:
            raise ConfigError("max_wait_s", "must not be negative")
        if self.max_pending < self.max_batch:
            raise ConfigError("max_pending", "must be at least max_batch")
        if not self.plans or len(set(self.plans)) != len(self.plans):
            raise ConfigError("plans", "must be a non-empty list of distinct plans")


class _Plan:
    """The pending requests of one plan: a FIFO per tenant and a ring of tenants for the turn."""

    __slots__ = ("queues", "ring")

    def __init__(self) -> None:
        self.queues: dict[str, deque[Waiting]] = {}
        self.ring: deque[str] = deque()

    def push(self, item: Waiting) -> None:
        queue = self.queues.get(item.tenant)
        if queue is None:
            queue = self.queues[item.tenant] = deque()
            self.ring.append(item.tenant)
        queue.append(item)

    def pop_turn(self) -> Waiting:
        tenant = self.ring[0]
        queue = self.queues[tenant]
        item = queue.popleft()
        if queue:
            self.ring.rotate(-1)
        else:
            self._drop(tenant)
        return item

    def remove(self, item: Waiting) -> None:
        queue = self.queues[item.tenant]
        queue.remove(item)
        if not queue:
            self._drop(item.tenant)

    def evict_newest_of_busiest(self) -> Waiting:
        tenant = max(self.queues, key=lambda t: len(self.queues[t]))
        item = self.queues[tenant].pop()
        if not self.queues[tenant]:
            self._drop(tenant)
        return item

    def _drop(self, tenant: str) -> None:
        del self.queues[tenant]
        self.ring.remove(tenant)


class Batcher:
    """One model's pending requests, the flush rule and the fill order."""

    def __init__(self, config: BatcherConfig, *, model: str = "") -> None:
        self.config = config
        self.model = model
        self._plans = {plan: _Plan() for plan in config.plans}
        self._retry: deque[Waiting] = deque()
        self._live: dict[int, Waiting] = {}
        self._order: deque[int] = deque()  # arrival order of first-time requests; taken ones removed lazily

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, rid: int) -> bool:
        return rid in self._live

    def push(self, item: Waiting) -> Waiting | None:
        """Add a new request; returns the one it evicted, if any; raises QueueFull or InvalidArgument."""
        if item.plan not in self._plans:
            raise InvalidArgument("ferry_plan", f"unknown plan {item.plan!r} (known: {', '.join(self._plans)})")
        if item.rid in self._live:
            raise ValueError(f"request {item.rid} is already pending")
        evicted = None
        if len(self._live) - len(self._retry) >= self.config.max_pending:
            evicted = self._evict_below(item.plan)
            if evicted is None:
                raise QueueFull(self.model, self.config.max_pending, self.config.retry_after_s)
        self._plans[item.plan].push(item)
        self._live[item.rid] = item
        self._order.append(item.rid)
        return evicted

    def requeue(self, items: list[Waiting]) -> None:
        """Put the requests of a failed batch back at the head, in their order, one attempt more each."""
        for item in reversed(items):
            again = dataclasses.replace(item, attempts=item.attempts + 1)
            self._retry.appendleft(again)
            self._live[again.rid] = again

    def remove(self, rid: int) -> bool:
        """Forget a pending request (its client went away); False when it is not pending."""
        item = self._live.pop(rid, None)
        if item is None:
            return False
        if item in self._retry:
            self._retry.remove(item)
        else:
            self._plans[item.plan].remove(item)
        return True

    def drain(self) -> list[Waiting]:
        """Take every pending request out (the model became unavailable)."""
        items = list(self._retry)
        for plan in self._plans.values():
            while plan.ring:
                items.append(plan.pop_turn())
        self._retry.clear()
        self._live.clear()
        self._order.clear()
        return items

    def oldest_arrival(self) -> float | None:
        """Arrival time of the oldest pending request, or None when nothing waits."""
        if self._retry:
            return self._retry[0].arrival
        order, live = self._order, self._live
        while order and order[0] not in live:
            order.popleft()
        return live[order[0]].arrival if order else None

    def due(self, now: float) -> FlushReason | None:
        """Why a batch should leave now, or None when it should keep filling."""
        if self._retry:
            return "retry"
        if len(self._live) >= self.config.max_batch:
            return "size"
        oldest = self.oldest_arrival()
        if oldest is not None and oldest + self.config.max_wait_s <= now:  # same sum as deadline()
            return "time"
        return None

    def deadline(self) -> float | None:
        """When the time rule fires for the current oldest request, or None when nothing waits."""
        oldest = self.oldest_arrival()
        return None if oldest is None else oldest + self.config.max_wait_s

    def take(self) -> list[Waiting]:
        """Up to ``max_batch`` requests in fill order (retry lane, then plans, round robin across tenants)."""
        limit = self.config.max_batch
        batch: list[Waiting] = []
        while self._retry and len(batch) < limit:
            batch.append(self._retry.popleft())
        for plan in self._plans.values():
            while plan.ring and len(batch) < limit:
                batch.append(plan.pop_turn())
        for item in batch:
            del self._live[item.rid]
        if len(self._order) > 2 * len(self._live) + 64:
            self._order = deque(rid for rid in self._order if rid in self._live)
        return batch

    def _evict_below(self, plan: str) -> Waiting | None:
        rank = self.config.plans.index(plan)
        for lower in reversed(self.config.plans[rank + 1 :]):
            if self._plans[lower].ring:
                victim = self._plans[lower].evict_newest_of_busiest()
                del self._live[victim.rid]
                return victim
        return None
