"""Fair shares among tenants inside one tier: deficit round robin weighted by tokens.

:class:`DeficitRoundRobin` keeps one FIFO per tenant and a ring of the
tenants that have work. Algorithm (deficit round robin): the tenant
at the head of the ring may dispatch its head request when that request's
cost (prompt tokens + max tokens, capped at ``max_cost``) fits its deficit;
otherwise the tenant goes to the back of the ring and the next tenant's
deficit grows by ``quantum`` x its weight. A tenant whose queue empties
leaves the ring and loses its deficit, so idle tenants bank no credit. Over
any busy period each backlogged tenant gets tokens in proportion to its
weight (the plan's: free 1, paid 4, enterprise 8 in
:mod:`dataplane.admission.queues`), whatever its request rate: a tenant that sends 60 % of the requests
gets no more than its share while others wait.

A tenant that had nothing waiting enters at the head of the ring with one
quantum (the "new flows first" rule of FQ-CoDel): a tenant under its share
waits for no round of the heavy ones, and gets no more than one quantum
before taking its turn like the others.

:meth:`DeficitRoundRobin.pop` may be given the tenants that are
``blocked`` (at their concurrency ceiling): they are passed over, keep
their place and gain no quantum while blocked. :func:`tenant_ceilings` is
that ceiling: a tenant with work may run at most ``factor`` x its weighted
share of the slots its tier could hold (alone, all of them). Ordering the
queue alone is not enough: a tenant sending 60 % of the traffic would still
fill every slot the others leave, and the others' steps slow with it.

Parameters: ``quantum`` (default 1,024 tokens), ``max_cost`` (default 16 x
quantum: bounds the rounds one pop may take). Removal (a timeout, a
cancellation) is lazy: the item is marked and skipped when it reaches the
head. :meth:`push_front` puts a request back at the head of its tenant's
queue (a preempted one) and its tenant at the head of the ring.

Cost: O(1) amortised per push and pop (at most ``max_cost / quantum`` ring
turns per pop); memory O(items + tenants with work).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Hashable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class DeficitRoundRobin(Generic[T]):
    """Per-tenant FIFOs served in deficit round robin; see the module docstring."""

    def __init__(self, *, quantum: int = 1024, max_cost: int | None = None) -> None:
        self.quantum = max(quantum, 1)
        self.max_cost = max_cost if max_cost is not None else 16 * self.quantum
        self._weight: dict[str, float] = {}
        self._queues: dict[str, deque[tuple[T, int]]] = {}
        self._deficit: dict[str, float] = {}
        self._ring: deque[str] = deque()
        self._dead: set[T] = set()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def tenants(self) -> int:
        """Tenants with work waiting."""
        return len(self._ring)

    def push(self, tenant: str, item: T, cost: int, weight: float = 1.0) -> None:
        """Append ``item`` of ``cost`` tokens to ``tenant``'s queue; ``weight`` scales its quantum."""
        self._enqueue(tenant, item, cost, front=False, weight=weight)
        self._weight[tenant] = max(weight, 1e-3)

    def push_front(self, tenant: str, item: T, cost: int) -> None:
        """Put ``item`` back at the head of ``tenant``'s queue, and ``tenant`` first in the ring."""
        self._enqueue(tenant, item, cost, front=True)

    def _enqueue(self, tenant: str, item: T, cost: int, *, front: bool, weight: float = 1.0) -> None:
        cost = min(max(cost, 1), self.max_cost)
        queue = self._queues.get(tenant)
        if queue is None:  # a tenant with nothing waiting goes first, with one quantum (sparse tenants first)
            queue = self._queues[tenant] = deque()
            self._deficit[tenant] = self.quantum * max(weight, 1e-3)
            self._ring.appendleft(tenant)
        elif front and self._ring[0] != tenant:
            self._ring.remove(tenant)
            self._ring.appendleft(tenant)
        queue.appendleft((item, cost)) if front else queue.append((item, cost))
        if front:  # already paid for once: it goes next, not after a round
            self._deficit[tenant] = max(self._deficit[tenant], cost)
        self._len += 1

    def remove(self, item: T) -> None:
        """Forget ``item`` (lazily: skipped when it reaches the head of its queue)."""
        if item not in self._dead:
            self._dead.add(item)
            self._len -= 1

    def depth(self, tenant: str) -> int:
        """Items of ``tenant`` queued (removed ones still counted until they reach the head)."""
        queue = self._queues.get(tenant)
        return len(queue) if queue else 0

    def share(self, tenant: str, weight: float = 1.0) -> float:
        """The share of dispatches ``tenant`` (of ``weight``) gets while everyone with work stays busy."""
        total = sum(self._weight.get(t, 1.0) for t in self._ring)
        mine = self._weight.get(tenant, max(weight, 1e-3))
        return mine / (total if tenant in self._queues else total + mine)

    def newest(self, tenant: str) -> T | None:
        """The last live item of ``tenant``'s queue (what to evict first), or None."""
        for item, _ in reversed(self._queues.get(tenant, ())):
            if item not in self._dead:
                return item
        return None

    def peek_tenant(self) -> str | None:
        """The tenant whose turn it is, or None when empty."""
        self._drop_dead()
        return self._ring[0] if self._ring else None

    def pop(self, blocked: Container[str] = frozenset()) -> T | None:
        """The next item in DRR order, or None when empty or every tenant with work is ``blocked``.

        A blocked tenant (at its concurrency ceiling) is passed over without
        gaining a quantum and keeps its place in the ring for the next call.
        """
        passed = 0
        while self._ring:
            self._drop_dead()
            if not self._ring:
                return None
            tenant = self._ring[0]
            if tenant in blocked:
                passed += 1
                if passed >= len(self._ring):
                    return None
                self._rotate(blocked)
                continue
            passed = 0
            queue = self._queues[tenant]
            item, cost = queue[0]
            if cost <= self._deficit[tenant]:
                queue.popleft()
                self._len -= 1
                self._deficit[tenant] -= cost
                if not queue or not self._live_head(tenant):
                    self._leave(tenant)
                return item
            self._rotate(blocked)
        return None

    def _rotate(self, blocked: Container[str]) -> None:
        """The head tenant goes to the back; the new head, unless blocked, gains its quantum (a new visit)."""
        self._ring.rotate(-1)
        nxt = self._ring[0]
        if nxt not in blocked:
            self._deficit[nxt] += self.quantum * self._weight.get(nxt, 1.0)

    def weights(self) -> dict[str, float]:
        """The weight of every tenant with work waiting."""
        return {t: self._weight.get(t, 1.0) for t in self._ring}

    def _live_head(self, tenant: str) -> bool:
        queue = self._queues[tenant]
        while queue and queue[0][0] in self._dead:
            self._dead.discard(queue.popleft()[0])
        return bool(queue)

    def _drop_dead(self) -> None:
        while self._ring and not self._live_head(self._ring[0]):
            self._leave(self._ring[0])

    def _leave(self, tenant: str) -> None:
        self._ring.popleft()
        del self._queues[tenant]
        del self._deficit[tenant]
        self._weight.pop(tenant, None)


def tenant_ceilings(limit: int, weights: Mapping[str, float], factor: float) -> dict[str, int]:
    """Concurrency ceiling of each tenant with work in a tier: ``factor`` x its weighted share of ``limit``.

    ``weights``: every tenant with work (running or waiting) in the tier and
    its plan weight. ``ceil(factor x limit x w / sum(w))``, at least 1; a
    tenant alone in its tier, or ``factor`` <= 0 (off), has the whole
    ``limit``. Bounding a tenant to its share, not only ordering the queue,
    keeps one tenant's traffic from filling the replicas the others share
    (their step times grow with what runs).
    """
    total = sum(max(w, 1e-3) for w in weights.values())
    if factor <= 0 or len(weights) <= 1 or total <= 0:
        return {t: limit for t in weights}
    return {t: max(1, math.ceil(factor * limit * max(w, 1e-3) / total)) for t, w in weights.items()}
