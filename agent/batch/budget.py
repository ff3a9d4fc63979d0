"""The batcher's ``max_wait``, derived from the latency budget rather than guessed.

Algorithm: a request's end-to-end time is the network, then one attempt (wait
in the batcher, wait for a free GPU, the batch itself), and, if its GPU dies
mid-batch, one more attempt (a retry = another wait and another batch time).
The budget, less a headroom kept for stragglers and jitter, must hold the
first attempt *and* the retry reserve::

    budget × (1 − headroom) = network + (1 + retries) × (wait + gpu_queue + batch)
    wait = (budget × (1 − headroom) − network) / (1 + retries) − gpu_queue − batch

Parameters and defaults (the fixed-batch contract and the brief's budget):
``budget_s`` 0.5 (P95 end to end), ``batch_s`` 0.1, ``network_s`` 0.02
(client to proxy to replica and back), ``gpu_queue_s`` 0.04 (a flushed batch
waiting for a free GPU), ``retries`` 1, ``headroom`` 0.2. They give
``wait`` = (400 − 20) / 2 − 40 − 100 = 50 ms, and a retry reserve of
190 ms (the brief's "about 200 ms back").

Why 50 and not 80: at 80 ms the retried path needs 20 + 2 × 220 = 460 ms of
the 400 ms the headroom leaves. Why not 20: it fits, but at a low rate a
time flush carries about 1 + rate × wait requests, so at 100 requests/s a
20 ms timer runs batches of 3 and keeps 3.3 GPUs busy where 50 ms keeps 1.7
(:func:`busy_gpus`).

Cost: O(1); :func:`derive` returns the derivation as data for the capacity
calculator to print.
"""

from __future__ import annotations

import dataclasses
import math

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatencyBudget:
    """What the budget is spent on; all times in seconds."""

    budget_s: float = 0.5
    batch_s: float = 0.1
    network_s: float = 0.02
    gpu_queue_s: float = 0.04
    retries: int = 1
    headroom: float = 0.2

    def __post_init__(self) -> None:
        for key in ("budget_s", "batch_s", "network_s", "gpu_queue_s"):
            if getattr(self, key) < 0:
                raise ConfigError(key, "must not be negative")
        if self.retries < 0:
            raise ConfigError("retries", "must not be negative")
        if not 0 <= self.headroom < 1:
            raise ConfigError("headroom", "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class Term:
    """One line of the derivation: a name, its milliseconds, and why."""

    name: str
    ms: float
    note: str


@dataclasses.dataclass(frozen=True)
class Derivation:
    """``max_wait_s`` and the terms that add up to the budget."""

    max_wait_s: float
    terms: tuple[Term, ...]
    retry_reserve_ms: float
    formula: str

    def lines(self) -> list[str]:
        """Human-readable lines, one per term, then the result."""
        out = [f"  {t.name:<22} {t.ms:7.1f} ms  {t.note}" for t in self.terms]
        out.append(f"  {'= budget':<22} {sum(t.ms for t in self.terms):7.1f} ms")
        out.append(f"  max_wait = {self.formula} = {self.max_wait_s * 1e3:.1f} ms")
        return out


def derive(budget: LatencyBudget) -> Derivation:
    """Solve the budget equation for the batcher's wait; raises ConfigError when nothing is left for it."""
    usable = budget.budget_s * (1 - budget.headroom)
    attempts = 1 + budget.retries
    wait = (usable - budget.network_s) / attempts - budget.gpu_queue_s - budget.batch_s
    if wait <= 0:
        raise ConfigError(
            "budget_ms",
            f"{budget.budget_s * 1e3:.0f} ms leaves no batcher wait for {attempts} attempts of "
            f"{budget.batch_s * 1e3:.0f} ms batches",
        )
    ms = 1e3
    terms = (
        Term("network", budget.network_s * ms, "client to proxy to replica and back"),
        Term("batcher wait", wait * ms, "oldest request waits at most this, then the batch leaves"),
        Term("gpu queue", budget.gpu_queue_s * ms, "a flushed batch waits for a free GPU"),
        Term("batch", budget.batch_s * ms, "the fixed batch time on the GPU"),
        Term(
            "retry reserve",
            budget.retries * (wait + budget.gpu_queue_s + budget.batch_s) * ms,
            f"{budget.retries} retry after a GPU dies mid-batch: wait + gpu queue + batch again",
        ),
        Term("headroom", budget.budget_s * budget.headroom * ms, f"{budget.headroom:.0%} kept for stragglers, jitter"),
    )
    formula = (
        f"({budget.budget_s * ms:.0f} x (1 - {budget.headroom:g}) - {budget.network_s * ms:.0f}) / {attempts}"
        f" - {budget.gpu_queue_s * ms:.0f} - {budget.batch_s * ms:.0f}"
    )
    return Derivation(wait, terms, terms[4].ms, formula)


def max_wait_s(budget: LatencyBudget) -> float:
    """The derived batcher wait in seconds."""
    return derive(budget).max_wait_s


def busy_gpus(rate: float, wait_s: float, batch_s: float, max_batch: int) -> float:
    """GPUs kept busy by ``rate`` requests/s when every batch leaves on the timer or full.

    A time flush carries the request that started the timer plus those that
    arrive during ``wait_s``: about ``1 + rate × wait_s``, capped at ``max_batch``.
    """
    per_batch = min(float(max_batch), 1 + rate * wait_s)
    return rate / per_batch * batch_s


def floor_gpus(rate: float, max_batch: int, batch_s: float) -> int:
    """GPUs needed at perfect fill: ``rate / (max_batch / batch_s)``, rounded up."""
    return max(1, math.ceil(rate / (max_batch / batch_s) - 1e-9))


def rule_of_thumb_gpus(rate: float, max_batch: int, batch_s: float, utilisation: float = 0.65, spares: int = 2) -> int:
    """The floor run at ``utilisation`` plus ``spares``: ``ceil(rate / per_gpu / utilisation) + spares``."""
    return math.ceil(rate / (max_batch / batch_s) / utilisation - 1e-9) + spares
