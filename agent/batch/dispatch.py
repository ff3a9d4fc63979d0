"""Node dispatcher: batchers, the GPU scheduler and the request-to-batch mapping (pure).

One :class:`~agent.batch.batcher.Batcher` per model and one
:class:`~agent.batch.gpusched.GpuScheduler` per node. The caller (the asyncio
runtime, or the virtual-time simulator) feeds it events with the time they
happen and carries out what it returns:

- :meth:`NodeDispatcher.submit` a request; :meth:`cancel` one whose client left;
- :meth:`pump` forms and places every batch that is due and has GPUs (pull
  model: a batch is formed when a GPU takes it, so under load it fills while
  it waits), returning :class:`Dispatch` records; :meth:`next_wake` is when to
  pump again if nothing else happens;
- :meth:`complete` a batch (the records to answer, in order; None for a batch
  that was aborted, so a late result is never answered twice);
- :meth:`kill_gpu`: the batch on that GPU goes back to the head of its model's
  queue for another GPU; a request tried ``max_attempts`` times, or of a model
  the node can no longer run, fails instead.

A refused or evicted request's ``retry_after`` is :meth:`retry_after`: the
model's backlog over its measured drain rate (:mod:`agent.batch.drain`), or
over its capacity (batch slots × ``max_batch`` / ``batch_s``) before any
batch completed. :meth:`slots` and :meth:`running` give the load views the
runtime reports.

Every request ends exactly once: answered through :meth:`complete`, or failed
through a returned error (refused, evicted, unavailable, too many attempts).
Bounds: pending per model (``max_pending``), in flight at most one batch per
GPU. Cost: O(batch) per dispatch and completion, O(1) amortised per request.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from agent.batch.batcher import Batcher, BatcherConfig, FlushReason, QueueFull, Waiting
from agent.batch.drain import DrainMeter, retry_after_s
from agent.batch.gpusched import Branch, GpuScheduler, SchedulerConfig
from ferry.errors import ConfigError, FerryError, NoReplica, NotFound, ReplicaFailed


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelContract:
    """A hosted model's fixed batch contract and its batcher's limits."""

    name: str
    max_batch: int = 100
    gpus_per_batch: int = 1
    batch_s: float = 0.1
    max_wait_s: float = 0.05
    max_pending: int = 2000
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("max_attempts", "must be at least 1")

    def batcher_config(self) -> BatcherConfig:
        return BatcherConfig(max_batch=self.max_batch, max_wait_s=self.max_wait_s,
                             max_pending=self.max_pending, retry_after_s=self.batch_s)


@dataclasses.dataclass(frozen=True, slots=True)
class Dispatch:
    """A batch on its GPUs: the requests in order, why it left, and how it was placed."""

    batch_id: int
    model: str
    gpus: tuple[int, ...]
    items: tuple[Waiting, ...]
    reason: FlushReason
    branch: Branch
    started: float


@dataclasses.dataclass(frozen=True)
class KillReport:
    """What killing a GPU did: the batch it aborted, requests requeued and failed, models lost."""

    gpu: int
    batch_id: int | None
    model: str | None
    requeued: tuple[int, ...]
    failed: tuple[tuple[int, FerryError], ...]
    unavailable: tuple[str, ...]


@dataclasses.dataclass
class DispatchStats:
    """Counters since start (the runtime's metrics and the simulators read them)."""

    submitted: int = 0
    dispatched: int = 0
    batches: int = 0
    completed: int = 0
    requeued: int = 0
    failed: int = 0
    evicted: int = 0
    stale_results: int = 0
    flushes: Counter[str] = dataclasses.field(default_factory=Counter)
    branches: Counter[str] = dataclasses.field(default_factory=Counter)

    @property
    def mean_fill(self) -> float:
        """Mean requests per batch."""
        return self.dispatched / self.batches if self.batches else 0.0


class NodeDispatcher:
    """The decisions of one node's batch runtime, driven by timed events."""

    def __init__(self, contracts: Sequence[ModelContract], scheduler: SchedulerConfig) -> None:
        if not contracts or len({c.name for c in contracts}) != len(contracts):
            raise ConfigError("models", "need at least one model, names unique")
        self.contracts = {c.name: c for c in contracts}
        self.batchers = {c.name: Batcher(c.batcher_config(), model=c.name) for c in contracts}
        self.scheduler = GpuScheduler(scheduler, {c.name: c.gpus_per_batch for c in contracts})
        self.meters = {c.name: DrainMeter() for c in contracts}
        self.stats = DispatchStats()
        self._inflight: dict[int, Dispatch] = {}
        self._batch_of: dict[int, int] = {}
        self._dropped: set[int] = set()
        self._next_rid = 1

    def submit(self, model: str, *, tenant: str, plan: str, now: float) -> tuple[int, int | None]:
        """Queue a request; returns its id and the id of a request it evicted (that one fails with QueueFull).

        Raises NotFound, NoReplica (the node cannot run the model now), QueueFull, InvalidArgument.
        """
        batcher = self.batchers.get(model)
        if batcher is None:
            raise NotFound("model", model)
        if not self.scheduler.available(model):
            raise NoReplica(model, self.scheduler.unavailable()[model])
        rid = self._next_rid
        self.meters[model].start(now)
        try:
            evicted = batcher.push(Waiting(rid, tenant, plan, now))
        except QueueFull as full:
            raise QueueFull(model, full.limit, self.retry_after(model, now)) from None
        self._next_rid += 1
        self.stats.submitted += 1
        if evicted is not None:
            self.stats.evicted += 1
        return rid, None if evicted is None else evicted.rid

    def cancel(self, rid: int) -> bool:
        """Forget a request whose client went away; True when it was pending or in flight."""
        if rid in self._batch_of:
            self._dropped.add(rid)
            return True
        return any(b.remove(rid) for b in self.batchers.values())

    def pending(self, model: str) -> int:
        return len(self.batchers[model])

    def running(self, model: str) -> int:
        """Requests of ``model`` in batches on GPUs now; O(batches in flight)."""
        return sum(len(d.items) for d in self._inflight.values() if d.model == model)

    def slots(self, model: str) -> int:
        """Batches of ``model`` the node's healthy GPUs can run at once."""
        healthy = self.scheduler.config.gpus - len(self.scheduler.failed_gpus)
        return healthy // self.scheduler.need(model)

    def retry_after(self, model: str, now: float) -> float:
        """Seconds a refused request of ``model`` should wait: its backlog over the queue's drain rate."""
        contract = self.contracts[model]
        rate = self.meters[model].rate(now) or self.slots(model) * contract.max_batch / contract.batch_s
        return retry_after_s(self.pending(model), rate, floor_s=contract.batch_s)

    def in_flight(self) -> dict[int, Dispatch]:
        return dict(self._inflight)

    def pump(self, now: float) -> list[Dispatch]:
        """Form and place every batch that is due and fits; O(batches placed × models)."""
        out: list[Dispatch] = []
        while True:
            ready = self._ready(now)
            launch = self.scheduler.decide(now, ready)
            if launch is None:
                return out
            batcher = self.batchers[launch.model]
            reason = batcher.due(now)
            assert reason is not None, "the scheduler placed a batch that was not due"
            items = tuple(batcher.take())
            d = Dispatch(launch.batch_id, launch.model, launch.gpus, items, reason, launch.branch, now)
            self._inflight[d.batch_id] = d
            for item in items:
                self._batch_of[item.rid] = d.batch_id
            self.stats.batches += 1
            self.stats.dispatched += len(items)
            self.stats.flushes[reason] += 1
            self.stats.branches[launch.branch] += 1
            out.append(d)

    def next_wake(self, now: float) -> float | None:
        """When to pump again if no event comes first: a batcher's timer or a batch coming of age."""
        times = [t for b in self.batchers.values() if (t := b.deadline()) is not None and t > now]
        aging = self.scheduler.wake_at(now, self._ready(now))
        if aging is not None:
            times.append(aging)
        return min(times, default=None)

    def complete(self, batch_id: int, now: float) -> Dispatch | None:
        """A batch returned; the dispatch to answer in order, or None when it was aborted before."""
        d = self._close(batch_id, now)
        if d is None:
            self.stats.stale_results += 1
            return None
        self.stats.completed += len(d.items)
        self.meters[d.model].record(now, len(d.items))
        return d

    def fail_batch(self, batch_id: int, now: float) -> Dispatch | None:
        """The batch function raised: its requests fail (the GPU stays healthy); None if already aborted."""
        d = self._close(batch_id, now)
        if d is not None:
            self.stats.failed += len(d.items)
        return d

    def kill_gpu(self, gpu: int, now: float) -> KillReport:
        """Fail ``gpu``: its batch goes back to the head of the queue; requests that cannot run fail."""
        aborted = self.scheduler.fail_gpu(gpu, now)
        lost = self.scheduler.unavailable()
        failed: list[tuple[int, FerryError]] = []
        requeued: list[Waiting] = []
        d = None if aborted is None else self._close(aborted.batch_id, now, keep_dropped=True)
        if d is not None:
            contract = self.contracts[d.model]
            for item in d.items:
                if item.rid in self._dropped:
                    self._dropped.discard(item.rid)
                elif d.model in lost:
                    failed.append((item.rid, NoReplica(d.model, lost[d.model])))
                elif item.attempts + 1 >= contract.max_attempts:
                    failed.append((item.rid, ReplicaFailed(
                        f"{d.model}/gpu{gpu}", f"GPU failed on all {contract.max_attempts} attempts",
                        output_started=False, retryable=True)))
                else:
                    requeued.append(item)
            self.batchers[d.model].requeue(requeued)
        for model, reason in lost.items():
            failed += [(item.rid, NoReplica(model, reason)) for item in self.batchers[model].drain()]
        self.stats.requeued += len(requeued)
        self.stats.failed += len(failed)
        return KillReport(gpu, None if d is None else d.batch_id, None if d is None else d.model,
                          tuple(i.rid for i in requeued),
                          tuple(failed), tuple(sorted(lost)))

    def restore_gpu(self, gpu: int, now: float) -> bool:
        """Bring a failed GPU back into service."""
        return self.scheduler.restore_gpu(gpu, now)

    def _ready(self, now: float) -> dict[str, float]:
        ready = {}
        for model, batcher in self.batchers.items():
            if batcher.due(now) is not None:
                oldest = batcher.oldest_arrival()
                assert oldest is not None
                ready[model] = oldest
        return ready

    def _close(self, batch_id: int, now: float, *, keep_dropped: bool = False) -> Dispatch | None:
        d = self._inflight.pop(batch_id, None)
        if d is None:
            return None
        self.scheduler.finish(batch_id, now)
        for item in d.items:
            del self._batch_of[item.rid]
            if not keep_dropped:
                self._dropped.discard(item.rid)
        return d
