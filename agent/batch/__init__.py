"""Ferry's batch runtime: a KServe v2 replica for backends with a fixed batch contract.

Pure decisions, reused unchanged in virtual time: :mod:`.budget` (``max_wait``
from the latency budget), :mod:`.batcher` (size-or-time flush, plan then
tenant fill), :mod:`.gpusched` (one-GPU and gang batches on a node),
:mod:`.dispatch` (the three bound together with the request-to-batch mapping),
:mod:`.drain` (drain rate and retry-after), :mod:`.telemetry` (per-GPU busy
share, the load snapshot) and :mod:`.simulate` (discrete-event runs of the
dispatcher). Edges: :mod:`.runtime` (asyncio, simulated GPUs), :mod:`.server`
(KServe v2 gRPC), :mod:`.metrics`, :mod:`.host` (a runtime in a process, its
flags), :mod:`.main` (``ferry batch-runtime``; ``ferry node --batch-runtime``
is in :mod:`agent.main`). :mod:`.reference` holds the reference backend
``batchstring``. docs/batch.md tells the whole story.
"""

from agent.batch.batcher import Batcher, BatcherConfig, FlushReason, QueueFull, Waiting
from agent.batch.budget import Derivation, LatencyBudget, derive
from agent.batch.dispatch import Dispatch, KillReport, ModelContract, NodeDispatcher
from agent.batch.gpusched import GpuScheduler, Launch, SchedulerConfig

__all__ = [
    "Batcher",
    "BatcherConfig",
    "Derivation",
    "Dispatch",
    "FlushReason",
    "GpuScheduler",
    "KillReport",
    "LatencyBudget",
    "Launch",
    "ModelContract",
    "NodeDispatcher",
    "QueueFull",
    "SchedulerConfig",
    "Waiting",
    "derive",
]
