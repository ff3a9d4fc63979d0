"""Node GPU scheduler: one-GPU batches and all-GPU gang batches on one node (pure).

Each model needs a fixed number of GPUs per batch (1 for a small model, the
node's 8 for a large one). :meth:`GpuScheduler.decide` is given, for every
model with a batch due, the arrival time of its oldest request, and places at
most one batch per call (the caller calls again until it gets None):

- No gang batch due: the oldest due batch that fits takes the lowest free
  GPUs (branch ``fit``). A batch takes all its GPUs atomically or none.
- A gang batch (more than one GPU) due, ``reserve`` on: the oldest one goes
  first if it fits. If it does not, it holds the node: no new batch starts,
  running ones finish, and when enough GPUs are free it launches (branch
  ``drained``). GPUs left free meanwhile are the drain's idle cost, counted in
  ``drain_idle_gpu_s``.
- Aging (``aging`` on): while a gang batch is due, a batch whose oldest
  request has waited ``age_limit_s`` or more, and arrived no later than the
  gang's oldest, still starts first (branch ``aged``). Small work then waits at
  most about ``age_limit_s`` plus a gang's drain and run; the gang waits at
  most for the small work older than itself. Aging off: a stream of gang
  batches can starve the small model. ``reserve`` off is the greedy baseline:
  a gang starts only when the node happens to be free, and may starve.

A failed GPU never gets work; its batch is aborted and returned to the caller
for requeue; a model that needs more GPUs than remain healthy is unavailable
on this node until the GPU is restored.

Defaults: 8 GPUs, ``reserve`` on, ``aging`` on, ``age_limit_s`` 0.2. Cost of
a call: O(models × log models + GPUs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from ferry.errors import ConfigError

Branch = Literal["fit", "drained", "aged"]
BRANCHES: tuple[Branch, ...] = ("fit", "drained", "aged")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The node's GPU count and the gang policy."""

    gpus: int = 8
    reserve: bool = True
    aging: bool = True
    age_limit_s: float = 0.2

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ConfigError("gpus", "must be at least 1")
        if self.age_limit_s < 0:
            raise ConfigError("age_limit_s", "must not be negative")


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """A batch placed on GPUs: its id, model, GPUs, the branch that placed it, and when."""

    batch_id: int
    model: str
    gpus: tuple[int, ...]
    branch: Branch
    started: float


class GpuScheduler:
    """Which GPUs run which batch on one node; the only owner of GPU state."""

    def __init__(self, config: SchedulerConfig, models: Mapping[str, int]) -> None:
        for model, need in models.items():
            if not 1 <= need <= config.gpus:
                raise ConfigError(f"models.{model}.gpus_per_batch", f"must be between 1 and {config.gpus}")
        self.config = config
        self._need = dict(models)
        self._free = set(range(config.gpus))
        self._failed: set[int] = set()
        self._running: dict[int, Launch] = {}
        self._gpu_batch: dict[int, int] = {}
        self._holder: tuple[float, str] | None = None  # (oldest arrival, model) of the gang holding the node
        self._last = 0.0
        self._next_id = 1
        self.drain_idle_gpu_s = 0.0

    # --- views -------------------------------------------------------------------------------

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(sorted(self._free))

    @property
    def failed_gpus(self) -> tuple[int, ...]:
        return tuple(sorted(self._failed))

    @property
    def running(self) -> dict[int, Launch]:
        return dict(self._running)

    @property
    def holder(self) -> str | None:
        """The gang model holding the node (draining it), if any."""
        return None if self._holder is None else self._holder[1]

    def need(self, model: str) -> int:
        return self._need[model]

    def available(self, model: str) -> bool:
        """Whether the node still has enough healthy GPUs for one batch of ``model``."""
        return self._need[model] <= self.config.gpus - len(self._failed)

    def unavailable(self) -> dict[str, str]:
        """Models this node cannot run now, with the reason."""
        healthy = self.config.gpus - len(self._failed)
        return {
            m: f"needs {n} GPUs per batch, {healthy} of {self.config.gpus} healthy on this node"
            for m, n in self._need.items()
            if n > healthy
        }

    def invariants(self) -> list[str]:
        """Violations of the scheduler's invariants (empty when all hold); O(GPUs)."""
        bad = []
        busy = [g for launch in self._running.values() for g in launch.gpus]
        if len(busy) != len(set(busy)) or len(busy) > self.config.gpus:
            bad.append(f"GPUs in use {sorted(busy)} overlap or exceed {self.config.gpus}")
        bad += [f"batch {b.batch_id} has {len(b.gpus)} GPUs, needs {self._need[b.model]}"
                for b in self._running.values() if len(b.gpus) != self._need[b.model]]
        if self._failed & set(busy) or self._failed & self._free:
            bad.append(f"failed GPUs {sorted(self._failed)} have work or are free")
        if self._free | set(busy) | self._failed != set(range(self.config.gpus)):
            bad.append("a GPU is neither free, busy nor failed")
        return bad

    # --- decisions ---------------------------------------------------------------------------

    def decide(self, now: float, ready: Mapping[str, float]) -> Launch | None:
        """Place at most one due batch; ``ready`` maps model to its oldest request's arrival."""
        self._advance(now)
        cands = sorted((since, model) for model, since in ready.items() if self.available(model))
        free = len(self._free)
        gang = next(((s, m) for s, m in cands if self._need[m] > 1), None) if self.config.reserve else None
        if gang is None:
            self._holder = None
            fits = next((m for _s, m in cands if self._need[m] <= free), None)
            return None if fits is None else self._place(fits, now, "fit")
        held, self._holder = self._holder, gang
        for since, model in cands:
            if model != gang[1] and self._need[model] <= free and self._aged(now, since, gang[0]):
                return self._place(model, now, "aged")
        if self._need[gang[1]] <= free:
            self._holder = None
            return self._place(gang[1], now, "drained" if held is not None and held[1] == gang[1] else "fit")
        return None

    def wake_at(self, now: float, ready: Mapping[str, float]) -> float | None:
        """The next time a decision may change with no other event: when a due batch comes of age."""
        if self._holder is None or not self.config.aging:
            return None
        times = [
            since + self.config.age_limit_s
            for model, since in ready.items()
            if since <= self._holder[0] and since + self.config.age_limit_s > now and self.available(model)
        ]
        return min(times, default=None)

    def finish(self, batch_id: int, now: float) -> Launch | None:
        """A batch ended; frees its GPUs. None for a batch no longer running (aborted before)."""
        self._advance(now)
        return self._release(batch_id)

    def fail_gpu(self, gpu: int, now: float) -> Launch | None:
        """Mark ``gpu`` failed; returns the batch it aborted (its other GPUs are freed), if any."""
        if not 0 <= gpu < self.config.gpus:
            raise ConfigError("gpu", f"must be between 0 and {self.config.gpus - 1}")
        self._advance(now)
        if gpu in self._failed:
            return None
        self._failed.add(gpu)
        self._free.discard(gpu)
        batch_id = self._gpu_batch.get(gpu)
        return None if batch_id is None else self._release(batch_id)

    def restore_gpu(self, gpu: int, now: float) -> bool:
        """Bring a failed GPU back; False when it had not failed."""
        self._advance(now)
        if gpu not in self._failed:
            return False
        self._failed.discard(gpu)
        self._free.add(gpu)
        return True

    # --- internals ---------------------------------------------------------------------------

    def _aged(self, now: float, since: float, holder_since: float) -> bool:
        return self.config.aging and since + self.config.age_limit_s <= now and since <= holder_since

    def _place(self, model: str, now: float, branch: Branch) -> Launch:
        gpus = tuple(sorted(self._free)[: self._need[model]])
        launch = Launch(self._next_id, model, gpus, branch, now)
        self._next_id += 1
        self._free.difference_update(gpus)
        for gpu in gpus:
            self._gpu_batch[gpu] = launch.batch_id
        self._running[launch.batch_id] = launch
        return launch

    def _release(self, batch_id: int) -> Launch | None:
        launch = self._running.pop(batch_id, None)
        if launch is None:
            return None
        for gpu in launch.gpus:
            del self._gpu_batch[gpu]
            if gpu not in self._failed:
                self._free.add(gpu)
        return launch

    def _advance(self, now: float) -> None:
        if self._holder is not None and now > self._last:
            self.drain_idle_gpu_s += len(self._free) * (now - self._last)
        self._last = max(self._last, now)
