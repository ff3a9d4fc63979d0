"""The batch runtime in real time: asyncio edges around the pure node dispatcher.

Each request gets a future; :meth:`BatchRuntime.infer` submits it to the
:class:`~agent.batch.dispatch.NodeDispatcher` and awaits it. After every
event (a request, a batch back, a GPU killed, the dispatcher's timer) the
runtime pumps the dispatcher and starts what it placed: a batch runs the
hosted function once, in a thread pool if the function is synchronous (one
thread per GPU, plus as many for batches abandoned on a killed GPU), awaited
if it is a coroutine function. The scheduler guarantees one batch per GPU at
a time; a gang batch runs the function once on all its GPUs.

A GPU killed mid-batch (:meth:`BatchRuntime.kill_gpu`): the dispatcher puts
the batch's requests back at the head for another GPU, the batch's task is
cancelled and whatever the abandoned call returns later is never answered,
so every request gets exactly one answer or one error. A function that
raises, or breaks the contract (not one string per input), fails its batch's
requests with UNAVAILABLE (the proxy retries elsewhere); the GPU stays up.

Load: :meth:`BatchRuntime.load` is a :class:`~agent.batch.telemetry.RuntimeLoad`
snapshot (pending, running, batch slots, per-GPU busy share), exported by
:mod:`agent.batch.metrics` in the runtime's own registry. A refused or evicted
request's retry-after is the dispatcher's (the backlog over the drain rate).
``on_change`` is called after a GPU is killed or restored, so an agent in the
same process can report a model that became unavailable at once.

Bounds: pending per model (the dispatcher's ``max_pending``), in flight at
most one batch per GPU, threads ``2 × gpus``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from agent.batch.batcher import QueueFull
from agent.batch.dispatch import Dispatch, KillReport, ModelContract, NodeDispatcher
from agent.batch.gpusched import SchedulerConfig
from agent.batch.metrics import BatchMetrics
from agent.batch.reference import check_outputs
from agent.batch.telemetry import BusyWindow, ModelView, RuntimeLoad
from ferry.errors import FerryError, ReplicaFailed, Unavailable
from ferry.logs import event

log = logging.getLogger(__name__)

VERSION = "1"  # the model version a runtime serves unless told otherwise (Triton's numbering)


# The concurrency target a batch replica advertises, in batches per slot: one running on the GPU and one
# filling in the batcher, so that the proxy's admission lets enough requests through to fill the next
# batch while the current one runs (with one, every batch would start only as the previous ended).
BATCHES_IN_FLIGHT = 2


@dataclasses.dataclass(frozen=True)
class HostedModel:
    """A model the runtime serves: its contract and its batch function."""

    contract: ModelContract
    function: Callable[[list[str]], Any]


@dataclasses.dataclass(frozen=True)
class Answer:
    """One request's output and where its time went."""

    text: str
    queue_s: float
    service_s: float
    batch_id: int
    attempts: int


@dataclasses.dataclass
class ModelCounters:
    """Per-model totals for KServe ModelStatistics."""

    answered: int = 0
    failed: int = 0
    batches: int = 0
    aborted: int = 0
    queue_s: float = 0.0
    service_s: float = 0.0
    compute_s: float = 0.0
    last_answer_ms: int = 0


@dataclasses.dataclass(slots=True)
class _Waiter:
    """One request waiting for its batch: its model, its text, when it arrived, and the future its answer resolves."""

    model: str
    text: str
    arrival: float
    future: asyncio.Future[Answer]


class BatchRuntime:
    """Hosts fixed-batch functions on a node's simulated GPUs."""

    def __init__(self, models: Sequence[HostedModel], scheduler: SchedulerConfig, *, version: str = VERSION,
                 registry: CollectorRegistry | None = None, on_change: Callable[[], None] | None = None) -> None:
        self.node = NodeDispatcher([m.contract for m in models], scheduler)
        self.version = version
        self._functions = {m.contract.name: m.function for m in models}
        self.counters = {m.contract.name: ModelCounters() for m in models}
        self.busy = BusyWindow(scheduler.gpus)
        self.metrics = BatchMetrics(self.load, registry)
        self._on_change = on_change
        self._waiters: dict[int, _Waiter] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def models(self) -> list[str]:
        return list(self._functions)

    @property
    def running(self) -> bool:
        return self._loop is not None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        gpus = self.node.scheduler.config.gpus
        self._executor = concurrent.futures.ThreadPoolExecutor(2 * gpus, thread_name_prefix="gpu")

    async def stop(self) -> None:
        """Stop: cancel running batches, fail waiting requests with UNAVAILABLE."""
        if self._timer is not None:
            self._timer.cancel()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        self._tasks.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(Unavailable("batch runtime stopping"))
        self._waiters.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._loop = None

    def model_status(self, model: str) -> tuple[bool, str]:
        """Whether ``model`` can take requests on this node, and why not."""
        if model not in self._functions:
            return False, "unknown model"
        reason = self.node.scheduler.unavailable().get(model, "")
        return self.running and not reason, reason or ("" if self.running else "not started")

    def load(self) -> RuntimeLoad:
        """A snapshot of the runtime's load (all zeros but the totals when stopped)."""
        node, sched = self.node, self.node.scheduler
        now = self._loop.time() if self._loop is not None else 0.0
        views = []
        for model, counters in self.counters.items():
            contract = node.contracts[model]
            views.append(ModelView(
                model=model, version=self.version, ready=self.model_status(model)[0], pending=node.pending(model),
                running=node.running(model),
                max_concurrency=BATCHES_IN_FLIGHT * contract.max_batch * node.slots(model),
                answered=counters.answered, failed=counters.failed, batches=counters.batches,
                aborted=counters.aborted))
        running = sched.running.values()
        shares = self.busy.utilization(now, ((b.gpus, b.started) for b in running))
        failed = set(sched.failed_gpus)
        utilization = tuple(None if gpu in failed else share for gpu, share in enumerate(shares))
        return RuntimeLoad(models=tuple(views), gpu_utilization=utilization,
                           gpus_in_use=sum(len(b.gpus) for b in running), drain_idle_gpu_s=sched.drain_idle_gpu_s)

    async def infer(self, model: str, text: str, *, tenant: str = "anonymous", plan: str = "paid") -> Answer:
        """Answer one input through a batch; raises a FerryError when refused or failed."""
        loop = self._loop
        if loop is None:
            raise Unavailable("batch runtime not running")
        now = loop.time()
        rid, evicted = self.node.submit(model, tenant=tenant, plan=plan, now=now)
        future: asyncio.Future[Answer] = loop.create_future()
        self._waiters[rid] = _Waiter(model, text, now, future)
        if evicted is not None:
            contract = self.node.contracts[model]
            self._fail(evicted, QueueFull(model, contract.max_pending, self.node.retry_after(model, now)))
        self._pump()
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiters.pop(rid, None) is not None:
                self.node.cancel(rid)
            raise

    def kill_gpu(self, gpu: int | None = None) -> KillReport:
        """Fail a GPU (None: the first GPU of the oldest running batch, else the lowest free one)."""
        loop = self._loop
        if loop is None:
            raise Unavailable("batch runtime not running")
        running = self.node.in_flight()
        if gpu is None:
            gpu = running[min(running)].gpus[0] if running else min(self.node.scheduler.free_gpus, default=0)
        now = loop.time()
        report = self.node.kill_gpu(gpu, now)
        if report.batch_id is not None:
            aborted = running[report.batch_id]
            self.busy.record(aborted.gpus, aborted.started, now)
            self.counters[aborted.model].aborted += 1
            task = self._tasks.pop(report.batch_id, None)
            if task is not None:
                task.cancel()
        if report.model is not None and report.requeued:
            self.metrics.requeued.labels(report.model).inc(len(report.requeued))
        event(log, "gpu_failed", logging.WARNING, gpu=gpu, batch_id=report.batch_id, model=report.model,
              requeued=len(report.requeued), failed=len(report.failed), models_lost=list(report.unavailable))
        for rid, error in report.failed:
            self._fail(rid, error)
        self._pump()
        self._changed()
        return report

    def restore_gpu(self, gpu: int) -> bool:
        """Bring a killed GPU back."""
        loop = self._loop
        if loop is None:
            raise Unavailable("batch runtime not running")
        restored = self.node.restore_gpu(gpu, loop.time())
        self._pump()
        self._changed()
        return restored

    # --- internals ---------------------------------------------------------------------------

    def _pump(self) -> None:
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        for d in self.node.pump(now):
            self._start(d)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wake = self.node.next_wake(now)
        if wake is not None:
            self._timer = loop.call_at(wake, self._pump)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _start(self, d: Dispatch) -> None:
        assert self._loop is not None
        inputs = [w.text if (w := self._waiters.get(item.rid)) else "" for item in d.items]
        self.metrics.batch_size.labels(d.model).observe(len(d.items))
        self.metrics.flushes.labels(d.model, d.reason).inc()
        self.metrics.placements.labels(d.model, d.branch).inc()
        self._tasks[d.batch_id] = self._loop.create_task(self._run(d, inputs), name=f"batch-{d.batch_id}")

    async def _run(self, d: Dispatch, inputs: list[str]) -> None:
        assert self._loop is not None and self._executor is not None
        fn = self._functions[d.model]
        try:
            if inspect.iscoroutinefunction(fn):
                raw = await fn(inputs)
            else:
                raw = await self._loop.run_in_executor(self._executor, fn, inputs)
            outputs = check_outputs(inputs, raw)
        except asyncio.CancelledError:
            return  # the GPU was killed (its requests are already requeued) or the runtime stops
        except Exception as exc:  # a failing backend fails its batch, not the runtime
            self._tasks.pop(d.batch_id, None)
            self.busy.record(d.gpus, d.started, self._loop.time())
            failed = self.node.fail_batch(d.batch_id, self._loop.time())
            for item in failed.items if failed else ():
                self._fail(item.rid, ReplicaFailed(f"{d.model}/gpu{d.gpus[0]}", f"batch function: {exc}",
                                                   output_started=False, retryable=True))
            self._pump()
            return
        self._tasks.pop(d.batch_id, None)
        now = self._loop.time()
        done = self.node.complete(d.batch_id, now)
        if done is not None:
            self.busy.record(d.gpus, d.started, now)
            counters = self.counters[d.model]
            counters.batches += 1
            counters.compute_s += now - d.started
            for item, text in zip(done.items, outputs, strict=True):
                self._answer(item.rid, Answer(text, d.started - item.arrival, now - item.arrival,
                                              d.batch_id, item.attempts + 1))
        self._pump()

    def _answer(self, rid: int, answer: Answer) -> None:
        waiter = self._waiters.pop(rid, None)
        if waiter is None or waiter.future.done():
            return  # the client went away
        counters = self.counters[waiter.model]
        counters.answered += 1
        counters.queue_s += answer.queue_s
        counters.service_s += answer.service_s
        waiter.future.set_result(answer)

    def _fail(self, rid: int, error: FerryError) -> None:
        waiter = self._waiters.pop(rid, None)
        if waiter is None or waiter.future.done():
            return
        self.counters[waiter.model].failed += 1
        waiter.future.set_exception(error)
