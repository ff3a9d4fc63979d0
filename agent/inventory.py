"""What the agent knows of its node's replicas, and the ``ferry.v1.Fleet`` messages built from it (pure).

- :class:`ReplicaSpec`: what a replica is (its ``ReplicaInfo``).
- :class:`Inventory`: the replicas with their status and last load, bounded
  by ``max_replicas``. It records which replicas were added, changed or
  removed since the last ``Register`` or ``Telemetry``, so telemetry carries
  ``changed`` and ``removed`` exactly once, and builds both messages.
- each load carries the engine's step-counter deltas since the last
  message (:mod:`agent.stepcounters`), sent once: the telemetry that carries
  them clears them.
- :func:`merge_discovered` reconciles the replicas of a discovered endpoint
  with what it lists now.

Cost: O(replicas) per message.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from agent import stepcounters
from agent.states import ReplicaStatus, State
from agent.triton import ModelEntry, ModelLoad
from ferry import sampling
from ferry.v1 import common_pb2, fleet_pb2

PROTO_STATE = {
    State.WARMING: common_pb2.REPLICA_STATE_WARMING,
    State.READY: common_pb2.REPLICA_STATE_READY,
    State.DRAINING: common_pb2.REPLICA_STATE_DRAINING,
    State.DRAINED: common_pb2.REPLICA_STATE_DRAINED,
    State.DEAD: common_pb2.REPLICA_STATE_DEAD,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaSpec:
    """A replica as the fleet sees it; ``endpoint`` indexes the agent's endpoints."""

    replica_id: str
    model: str
    version: str
    address: str
    endpoint: int = 0
    kserve_model: str = ""
    gpus: int = 1
    max_concurrency: int = 0
    kv_block_tokens: int = 0
    max_context_tokens: int = 0
    discovered: bool = False
    inputs: tuple[str, ...] = ()  # the input tensors the model declares: its accepted sampling parameters
    http_address: str = ""  # host:port of its OpenAI-compatible HTTP endpoint ("": KServe v2 only)
    engine: str = ""  # simulated | triton | vllm | sglang | trtllm ("": unknown)

    @property
    def key(self) -> tuple[str, str]:
        """(model name, version) on the endpoint."""
        return (self.kserve_model or self.model, self.version)

    def info(self, state: State) -> fleet_pb2.ReplicaInfo:
        return fleet_pb2.ReplicaInfo(
            replica_id=self.replica_id, model=self.model, version=self.version, address=self.address,
            kserve_model=self.kserve_model or self.model, gpus=self.gpus, max_concurrency=self.max_concurrency,
            kv_block_tokens=self.kv_block_tokens, max_context_tokens=self.max_context_tokens,
            state=PROTO_STATE[state], inputs=sampling.bounded(self.inputs), http_address=self.http_address,
            engine=self.engine)


@dataclasses.dataclass
class Tracked:
    """A replica with its status and its last load."""

    spec: ReplicaSpec
    status: ReplicaStatus = dataclasses.field(default_factory=ReplicaStatus)
    load: ModelLoad | None = None
    steps_last: stepcounters.Counts | None = None  # the last reading of its step counters
    steps_pending: stepcounters.Counts | None = None  # their deltas since the last telemetry message

    def observe(self, load: ModelLoad | None) -> None:
        """Take a poll's load, and its step counters' delta into the pending sample."""
        self.load = load
        now = load.steps.counts if load is not None and load.steps is not None else None
        self.steps_last, self.steps_pending = stepcounters.advance(self.steps_last, self.steps_pending, now)


class Inventory:
    """The node's replicas, at most ``max_replicas``, with what changed since the last message."""

    def __init__(self, max_replicas: int) -> None:
        self.max_replicas = max_replicas
        self.replicas: dict[str, Tracked] = {}
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        self._seq = 0

    def upsert(self, spec: ReplicaSpec) -> bool:
        """Add or update a replica; False (nothing changes) when the inventory is full."""
        tracked = self.replicas.get(spec.replica_id)
        if tracked is None:
            if len(self.replicas) >= self.max_replicas:
                return False
            self.replicas[spec.replica_id] = Tracked(spec)
        elif tracked.spec == spec:
            return True
        else:
            tracked.spec = spec
        self._changed.add(spec.replica_id)
        self._removed.discard(spec.replica_id)
        return True

    def remove(self, replica_id: str) -> None:
        if self.replicas.pop(replica_id, None) is not None:
            self._changed.discard(replica_id)
            self._removed.add(replica_id)

    def counts(self) -> dict[State, int]:
        """Replicas per state."""
        counts = dict.fromkeys(State, 0)
        for tracked in self.replicas.values():
            counts[tracked.status.state] += 1
        return counts

    def register(self, *, node: str, region: str, gpus: int, agent_version: str) -> fleet_pb2.AgentMessage:
        """The Register message (it carries every replica, so nothing is pending after it)."""
        self._changed.clear()
        self._removed.clear()
        infos = [t.spec.info(t.status.state) for t in self.replicas.values()]
        return fleet_pb2.AgentMessage(register=fleet_pb2.Register(
            node=node, region=region, gpus=gpus, replicas=infos, agent_version=agent_version))

    def telemetry(self) -> fleet_pb2.AgentMessage:
        """The next Telemetry message: every replica's load, plus what changed since the last message."""
        self._seq += 1
        loads = [_load(rid, t) for rid, t in self.replicas.items()]
        for tracked in self.replicas.values():
            tracked.steps_pending = None  # sent (or, for a dead replica, dropped) once
        changed = [self.replicas[rid].spec.info(self.replicas[rid].status.state) for rid in sorted(self._changed)]
        removed = sorted(self._removed)
        self._changed.clear()
        self._removed.clear()
        return fleet_pb2.AgentMessage(telemetry=fleet_pb2.Telemetry(
            seq=self._seq, replicas=loads, changed=changed, removed=removed))


def _load(replica_id: str, tracked: Tracked) -> common_pb2.ReplicaLoad:
    state = PROTO_STATE[tracked.status.state]
    load = tracked.load
    if load is None or tracked.status.state is State.DEAD:
        return common_pb2.ReplicaLoad(replica_id=replica_id, state=state)
    engine = stepcounters.sample(
        tracked.steps_pending, kv_blocks_total=load.kv_blocks_total,
        kv_block_tokens=load.kv_block_tokens or tracked.spec.kv_block_tokens,
        max_running=load.max_running or tracked.spec.max_concurrency,
        max_step_tokens=load.steps.max_step_tokens if load.steps is not None else None,
        prefix_cache_blocks=load.steps.prefix_cache_blocks if load.steps is not None else 0)
    return common_pb2.ReplicaLoad(
        replica_id=replica_id, state=state, queued=load.queued, running=load.running,
        kv_blocks_free=load.kv_blocks_free, kv_blocks_total=load.kv_blocks_total,
        gpu_utilization=load.gpu_utilization, requests_total=load.requests_total,
        prefix_hit_blocks=load.prefix_hit_blocks, prefix_lookup_blocks=load.prefix_lookup_blocks,
        engine=engine)


def discovered_id(node: str, name: str, version: str) -> str:
    """A stable replica id for a model found on an adopted endpoint."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{node}-{name}-{version}")


def merge_discovered(inventory: Inventory, *, node: str, endpoint: int, address: str, gpus: int,
                     entries: Iterable[ModelEntry], default_max_concurrency: int = 16, http_address: str = "",
                     engine: str = "triton", tag: str = "") -> list[str]:
    """Make the inventory's replicas of ``endpoint`` match the models it lists now; the ids that did not fit.

    A model whose config states no batch size (``max_batch_size`` 0, as decoupled and
    non-batching models have) gets ``default_max_concurrency`` as its concurrency target; one whose
    instance groups pin GPUs (``entry.gpus``) holds those, any other the endpoint's ``gpus``.
    An OpenAI-HTTP endpoint passes its ``http_address`` (``address`` empty), its ``engine`` and a ``tag`` that
    keeps the ids of several such endpoints of one node apart.
    """
    seen: set[str] = set()
    refused: list[str] = []
    for entry in entries:
        rid = discovered_id(f"{node}{tag}", entry.name, entry.version)
        seen.add(rid)
        old = inventory.replicas.get(rid)
        kv_tokens = entry.kv_block_tokens or (old.spec.kv_block_tokens if old else 0)
        spec = ReplicaSpec(
            replica_id=rid, model=entry.name, version=entry.version, address=address, endpoint=endpoint,
            kserve_model=entry.name, gpus=entry.gpus or gpus,
            max_concurrency=entry.max_batch_size or default_max_concurrency, kv_block_tokens=kv_tokens,
            max_context_tokens=entry.max_context_tokens, discovered=True, inputs=entry.inputs,
            http_address=http_address, engine=engine)
        if not inventory.upsert(spec):
            refused.append(rid)
    for rid, tracked in list(inventory.replicas.items()):
        if tracked.spec.discovered and tracked.spec.endpoint == endpoint and rid not in seen:
            inventory.remove(rid)
    return refused
