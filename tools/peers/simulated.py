"""The peer benchmark's slice in the fleet simulator: each router's policy, the same requests, in virtual time.

For the rows a real run replays (:mod:`tools.peers.load`), :func:`simulate`
builds the simulator's requests with exactly what the replicas see: arrival
at the run's schedule (``due_s``), the output cap, and the chained 512-word
block hashes of each prompt (:func:`ferry.tokens.block_hashes`), then runs
:class:`tools.sim.fleet.Fleet` (one proxy, tables and telemetry every 0.5 s
as ``ferry up`` has them, the replicas' engine) once per seed and pools the
requests (:func:`tools.sim.report.summarize`). A router maps to the
simulator's policy that picks as it does (:data:`SIM_POLICY`): Ferry is the
proxy's own decision (:mod:`tools.sim.policies`), the cache-aware routers
``cache_aware_load`` (a prefix match over half the prompt, else the replica
with the fewest requests in flight, the first on a tie: what sglang-router
0.3.2 and vllm-router 0.1.17 were seen to do), round robin ``round_robin``,
a consistent hash of the body with no session id ``prompt_hash``.

:func:`ttft_floor`: what no router can beat, each request's own prefill with
one infinite cache shared by all (uncached tokens x the engine's prefill
rate, plus its base), as percentiles: a TTFT tail lower than that is
impossible on these replicas.

:func:`ranking`: routers ordered by TTFT p99 (ties by p50).

Cost: about a second of one core per router and seed for a few thousand requests.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping, Sequence
from typing import Any

from agent.replica.engine import EngineParams
from dataplane.config import ProxySettings
from ferry.tokens import BLOCK_TOKENS
from tools.report import percentile
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES, Ferry, PolicyFactory
from tools.sim.report import summarize
from tools.sim.workload import SimRequest, cached_lead

SIM_POLICY = {"ferry": "ferry", "ferry:envoy": "ferry",
              "sglang:cache_aware": "cache_aware_load", "vllm:cache_aware": "cache_aware_load",
              "sglang:round_robin": "round_robin", "vllm:round_robin": "round_robin",
              "vllm:consistent_hash": "prompt_hash", "sglang:random": "random", "vllm:random": "random"}


def requests(due: Sequence[float], prompt_tokens: Sequence[int], max_tokens: Sequence[int],
             hashes: Sequence[Sequence[int]]) -> list[SimRequest]:
    """The simulator's requests for a real run's plan (same schedule, sizes and block hashes)."""
    return [SimRequest(i, d, p, m, tuple(h))
            for i, (d, p, m, h) in enumerate(zip(due, prompt_tokens, max_tokens, hashes, strict=True))]


def simulate(label: str, reqs: Sequence[SimRequest], *, replicas: int, engine: EngineParams,
             seeds: int = 3, settings: ProxySettings | None = None) -> dict[str, Any] | None:
    """The simulator's figures for router ``label`` on ``reqs`` (None: no policy stands for it); Ferry's
    decision with the proxy ``settings`` the real run used (default: the defaults)."""
    policy = SIM_POLICY.get(label)
    if policy is None:
        return None
    config = FleetConfig(replicas=replicas, proxies=1, engine=engine, refresh_seconds=0.5, telemetry_seconds=0.5)
    factory: PolicyFactory = POLICIES[policy]
    if policy == "ferry" and settings is not None:
        factory = functools.partial(_ferry, settings=settings)
    runs = [Fleet(dataclasses.replace(config, seed=seed), factory, reqs).run() for seed in range(1, seeds + 1)]
    out = summarize(runs)
    out["policy"] = policy
    return out


def _ferry(proxy: int, rng: random.Random, *, settings: ProxySettings) -> Ferry:
    return Ferry(rng, settings)


def ttft_floor(reqs: Sequence[SimRequest], engine: EngineParams) -> dict[str, float]:
    """Percentiles (ms) of each request's own prefill with an infinite shared cache; see the module docstring."""
    seen: set[int] = set()
    times: list[float] = []
    for r in reqs:
        lead = cached_lead(r.hash_ids, seen)
        uncached = max(0, r.prompt_tokens - lead * BLOCK_TOKENS)
        times.append(engine.prefill_base_seconds + engine.prefill_seconds_per_token * uncached)
    return {f"p{p}": round(percentile(times, p) * 1000, 1) for p in (50, 90, 99)} if times else {}


def ranking(rows: Mapping[str, Mapping[str, float | None]]) -> list[str]:
    """Router labels by TTFT p99, then p50 (a missing figure last)."""
    def key(label: str) -> tuple[float, float]:
        row = rows[label]
        return (row.get("p99") or float("inf"), row.get("p50") or float("inf"))
    return sorted(rows, key=key)


def disagreements(real: Sequence[str], sim: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of routers (of different simulated policies) that the two rankings order differently."""
    at_real = {label: i for i, label in enumerate(real)}
    at_sim = {label: i for i, label in enumerate(sim)}
    both = [label for label in real if label in at_sim]
    return [(a, b) for i, a in enumerate(both) for b in both[i + 1:]
            if SIM_POLICY.get(a) != SIM_POLICY.get(b) and (at_real[a] < at_real[b]) != (at_sim[a] < at_sim[b])]
