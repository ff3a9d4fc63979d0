"""The engine samples kept per model and replica kind, bounded, and their fits (pure; the clock is passed in).

A **replica kind** is what a replica's registration (``ReplicaInfo``) says
about the hardware and software its steps run on: its engine (``simulated``,
``triton``, ``vllm``, ...), the GPUs it holds and the model version loaded
(:class:`Kind`, written ``engine/Ngpu/version``, e.g.
``simulated/1gpu/v1``). Replicas of one model and kind are assumed to step
alike, so their samples are fitted together; a replica whose steps differ
shows as a larger fit error.

:class:`EngineWindows` keeps, per (model, kind), the last ``max_samples``
(4,096) samples no older than ``max_age_seconds`` (one hour), and at most
``max_kinds`` (256) keys: a sample of a further key is refused and counted
(``dropped``). :meth:`EngineWindows.fits` fits each key's window
(:func:`controlplane.engines.fit.fit_steps`) and takes the static facts the
window's samples carry, each the value most of them carry (0: none known).

Cost: O(1) per sample kept (amortized: old samples leave on the next add or
fit); a fit O(window).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque

from controlplane.engines.fit import Interval, StepFit, fit_steps

MAX_SAMPLES = 4096
MAX_AGE_SECONDS = 3600.0
MAX_KINDS = 256


@dataclasses.dataclass(frozen=True, order=True)
class Kind:
    """What a replica's steps run on, from its registration."""

    engine: str
    gpus: int
    version: str

    def __str__(self) -> str:
        return f"{self.engine or 'unknown'}/{self.gpus}gpu/{self.version}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Facts:
    """An engine's static facts as a sample states them (0: unknown; ``unchunked``: no per-step prefill limit)."""

    kv_blocks_total: int = 0
    kv_block_tokens: int = 0
    max_running: int = 0
    max_step_tokens: int = 0
    unchunked: bool = False
    prefix_cache_blocks: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One interval of one replica, when it arrived."""

    at: float
    replica_id: str
    interval: Interval
    facts: Facts


@dataclasses.dataclass(frozen=True, kw_only=True)
class KindFit:
    """One (model, kind): its replicas with samples, the fit, the facts and the window's span."""

    model: str
    kind: Kind
    replica_ids: tuple[str, ...]
    fit: StepFit
    facts: Facts
    window_seconds: float


class EngineWindows:
    """Samples per (model, kind), bounded in count, age and keys."""

    def __init__(self, *, max_samples: int = MAX_SAMPLES, max_age_seconds: float = MAX_AGE_SECONDS,
                 max_kinds: int = MAX_KINDS) -> None:
        if max_samples < 1 or max_age_seconds <= 0 or max_kinds < 1:
            raise ValueError("max_samples >= 1, max_age_seconds > 0 and max_kinds >= 1 required")
        self.max_samples, self.max_age, self.max_kinds = max_samples, max_age_seconds, max_kinds
        self._windows: dict[tuple[str, Kind], deque[Sample]] = {}
        self.dropped = 0  # samples refused: a new key past max_kinds

    def __len__(self) -> int:
        return sum(len(w) for w in self._windows.values())

    def add(self, model: str, kind: Kind, sample: Sample) -> bool:
        """Keep ``sample`` in its key's window; False (counted) when the key is new and there are ``max_kinds``."""
        key = (model, kind)
        window = self._windows.get(key)
        if window is None:
            self.expire(sample.at)
            if len(self._windows) >= self.max_kinds:
                self.dropped += 1
                return False
            window = self._windows[key] = deque(maxlen=self.max_samples)
        window.append(sample)
        self._trim(window, sample.at)
        return True

    def expire(self, now: float) -> None:
        """Drop samples older than ``max_age_seconds``, and keys left without one."""
        for key in list(self._windows):
            window = self._windows[key]
            self._trim(window, now)
            if not window:
                del self._windows[key]

    def _trim(self, window: deque[Sample], now: float) -> None:
        while window and window[0].at < now - self.max_age:
            window.popleft()

    def fits(self, now: float, model: str = "") -> list[KindFit]:
        """Each key's fit (those of ``model`` only, when given), by model then kind."""
        self.expire(now)
        out = []
        for (name, kind), window in sorted(self._windows.items(), key=lambda kv: kv[0]):
            if model and name != model:
                continue
            samples = list(window)
            out.append(KindFit(
                model=name, kind=kind, replica_ids=tuple(sorted({s.replica_id for s in samples})),
                fit=fit_steps([s.interval for s in samples]), facts=_facts([s.facts for s in samples]),
                window_seconds=samples[-1].at - samples[0].at))
        return out


def _facts(all_facts: list[Facts]) -> Facts:
    """Each fact the value most samples state (ties: the larger); the step limit with its ``unchunked`` flag."""
    def mode(values: list[int]) -> int:
        known = Counter(v for v in values if v > 0)
        return max(known.items(), key=lambda kv: (kv[1], kv[0]))[0] if known else 0

    limits = Counter((f.max_step_tokens, f.unchunked) for f in all_facts if f.max_step_tokens > 0 or f.unchunked)
    limit, unchunked = max(limits.items(), key=lambda kv: (kv[1], kv[0]))[0] if limits else (0, False)
    return Facts(kv_blocks_total=mode([f.kv_blocks_total for f in all_facts]),
                 kv_block_tokens=mode([f.kv_block_tokens for f in all_facts]),
                 max_running=mode([f.max_running for f in all_facts]), max_step_tokens=limit, unchunked=unchunked,
                 prefix_cache_blocks=mode([f.prefix_cache_blocks for f in all_facts]))
