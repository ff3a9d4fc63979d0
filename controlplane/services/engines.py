"""Engine samples in and fits out: the agents' telemetry, the followers' relay, ``Admin.GetEngines``.

:class:`EngineService` holds this control plane's
:class:`controlplane.engines.window.EngineWindows`:

- **From agents** (``Fleet.Connect``): :meth:`EngineService.take` checks the
  ``engine`` sample of each load of a telemetry message (hostile input:
  INVALID_ARGUMENT naming the field, e.g.
  ``telemetry.replicas[0].engine.step_seconds``, before anything of the
  message is applied) and takes it out of the load, so a sample never
  reaches the fleet view, the tables or the proxies; once the message is
  applied, :meth:`EngineService.record` files each sample under its
  replica's model and kind (the node's registration says which; a replica
  the node does not hold is dropped and counted).
- **Between control planes**: a follower also keeps, while it follows, one
  summed sample per replica since its last report (at most
  ``max_relayed`` replicas, more are dropped and counted), which
  :meth:`EngineService.relay` hands to the report
  (``MemberReport.engine_samples``); the leader checks them
  (:meth:`EngineService.check_report`) and records them like its own agents'
  (:meth:`EngineService.record` with ``relay=False``). So the leader's fit
  sees every node's samples; a follower's sees its own nodes'.
- **Out**: :meth:`EngineService.engines` fits every window on demand
  (``Admin.GetEngines``, :mod:`controlplane.api.engines`), with the live
  replicas of each model and kind (``members``); a model and kind whose
  replicas sent no sample (an engine that exports no step counters) is
  listed with 0 samples and every parameter "no samples".

Bounds: the windows' (4,096 samples or one hour per key, 256 keys); the
relay's; rows listed: the windows' keys plus at most ``MAX_UNSAMPLED``;
samples with counts above :data:`MAX_COUNT` or step time above
:data:`MAX_STEP_SECONDS` are refused. State: the windows, the relay, the
drop count. Dependencies: the clocks, ``relaying`` (whether this control
plane follows a leader now) and ``members`` (every member it knows, with
``grace_seconds`` to tell the live ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from controlplane.engines.fit import PARAMS, Interval, fit_steps
from controlplane.engines.window import EngineWindows, Facts, Kind, KindFit, Sample
from controlplane.fleet.view import Member, is_live
from ferry.errors import InvalidArgument
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2

MAX_COUNT = 1 << 48  # steps or tokens in one sample
MAX_STEP_SECONDS = 86_400.0  # step time in one sample (a relay held back by a lost leader sums its intervals)
MAX_RELAYED = 16_384  # replicas with a sample waiting for the follower's next report
MAX_UNSAMPLED = 256  # (model, kind) rows listed with no sample
NAN = float("nan")


def check_sample(sample: common_pb2.EngineSample, field: str) -> None:
    """Raise InvalidArgument naming the first hostile field of ``sample`` (at ``field``)."""
    for name in ("prefill_steps", "prefill_tokens", "decode_steps", "decode_tokens", "intervals"):
        if getattr(sample, name) > MAX_COUNT:
            raise InvalidArgument(f"{field}.{name}", f"more than {MAX_COUNT}")
    t = sample.step_seconds
    if not math.isfinite(t) or not 0.0 <= t <= MAX_STEP_SECONDS:
        raise InvalidArgument(f"{field}.step_seconds", f"{t!r} is not in [0, {MAX_STEP_SECONDS:g}]")


def kind_of(info: fleet_pb2.ReplicaInfo) -> Kind:
    """A replica's kind, from its registration."""
    return Kind(engine=info.engine, gpus=info.gpus, version=info.version)


class EngineService:
    """The engine samples this control plane holds, their relay to the leader, and their fits."""

    def __init__(self, *, clock: Callable[[], float], wall: Callable[[], float], relaying: Callable[[], bool],
                 members: Callable[[], Iterable[Member]] = list, grace_seconds: float = 10.0,
                 windows: EngineWindows | None = None, max_relayed: int = MAX_RELAYED) -> None:
        self.windows = windows or EngineWindows()
        self._clock = clock
        self._wall = wall
        self._relaying = relaying
        self._members = members
        self._grace = grace_seconds
        self._max_relayed = max_relayed
        self._relay: dict[str, dict[str, common_pb2.EngineSample]] = {}  # node -> replica -> summed sample
        self._relayed = 0  # entries in _relay
        self.dropped = 0  # samples of replicas not held, or past the relay's bound

    # -- in

    def take(self, telemetry: fleet_pb2.Telemetry) -> list[common_pb2.EngineSample]:
        """Check and take out the engine sample of each load (replica_id set); raises InvalidArgument."""
        for i, load in enumerate(telemetry.replicas):
            if load.HasField("engine"):
                check_sample(load.engine, f"telemetry.replicas[{i}].engine")
        taken = []
        for load in telemetry.replicas:
            if load.HasField("engine"):
                sample = common_pb2.EngineSample()
                sample.CopyFrom(load.engine)
                sample.replica_id = load.replica_id
                taken.append(sample)
                load.ClearField("engine")
        return taken

    def check_report(self, report: admin_pb2.FollowerReport) -> None:
        """Raise InvalidArgument naming the first hostile engine sample of a follower's report."""
        for i, item in enumerate(report.members):
            for j, sample in enumerate(item.engine_samples):
                check_sample(sample, f"report.members[{i}].engine_samples[{j}]")

    def record(self, node: str, replicas: Mapping[str, fleet_pb2.ReplicaInfo],
               samples: Iterable[common_pb2.EngineSample], *, relay: bool = True) -> None:
        """File the samples of ``node``'s replicas (``replicas``: its registration) under their model and kind;
        with ``relay`` and while following, also keep them for the next report to the leader."""
        now = self._clock()
        relaying = relay and self._relaying()
        for s in samples:
            info = replicas.get(s.replica_id)
            if info is None:
                self.dropped += 1
                continue
            if not (s.prefill_steps or s.decode_steps):
                continue  # an idle interval tells the fit nothing
            interval = Interval(prefill_steps=s.prefill_steps, prefill_tokens=s.prefill_tokens,
                                decode_steps=s.decode_steps, decode_tokens=s.decode_tokens,
                                step_seconds=s.step_seconds)
            facts = Facts(kv_blocks_total=s.kv_blocks_total, kv_block_tokens=s.kv_block_tokens,
                          max_running=s.max_running, max_step_tokens=s.max_step_tokens, unchunked=s.unchunked,
                          prefix_cache_blocks=s.prefix_cache_blocks)
            if not self.windows.add(info.model, kind_of(info), Sample(at=now, replica_id=s.replica_id,
                                                                       interval=interval, facts=facts)):
                continue  # counted by the windows
            if relaying:
                self._keep(node, s)

    def _keep(self, node: str, sample: common_pb2.EngineSample) -> None:
        held = self._relay.setdefault(node, {})
        kept = held.get(sample.replica_id)
        if kept is None:
            if self._relayed >= self._max_relayed:
                self.dropped += 1
                return
            kept = held[sample.replica_id] = common_pb2.EngineSample(replica_id=sample.replica_id)
            self._relayed += 1
        for name in ("prefill_steps", "prefill_tokens", "decode_steps", "decode_tokens", "intervals"):
            setattr(kept, name, getattr(kept, name) + getattr(sample, name))
        kept.step_seconds += sample.step_seconds
        for name in ("kv_blocks_total", "kv_block_tokens", "max_running", "max_step_tokens", "unchunked",
                     "prefix_cache_blocks"):
            setattr(kept, name, getattr(sample, name))

    def relay(self) -> dict[str, list[common_pb2.EngineSample]]:
        """The samples kept for the leader since the last call, by node; the relay is empty after."""
        out = {node: list(held.values()) for node, held in self._relay.items()}
        self._relay = {}
        self._relayed = 0
        return out

    # -- out

    def engines(self, model: str = "", *, leading: bool = True) -> admin_pb2.GetEnginesResponse:
        """Every (model, kind)'s fit and facts (of ``model`` only, when given), with its live replicas."""
        now = self._clock()
        live = registered(self._members(), now=now, grace=self._grace, model=model)
        fits = {(f.model, f.kind): f for f in self.windows.fits(now, model)}
        keys = sorted(fits.keys() | set(sorted(live.keys() - fits.keys())[:MAX_UNSAMPLED]))
        views = []
        for key in keys:
            kind_fit = fits.get(key) or KindFit(model=key[0], kind=key[1], replica_ids=(), fit=fit_steps([]),
                                                facts=Facts(), window_seconds=0.0)
            view = engine_view(kind_fit)
            if key in live:
                view.ClearField("replica_ids")
                view.replica_ids.extend(live[key])
            views.append(view)
        return admin_pb2.GetEnginesResponse(engines=views, sampled_at=self._wall(), leading=leading,
                                            samples_dropped=self.dropped + self.windows.dropped)


def registered(members: Iterable[Member], *, now: float, grace: float,
               model: str = "") -> dict[tuple[str, Kind], list[str]]:
    """The live replicas by (model, kind), ids sorted (of ``model`` only, when given)."""
    out: dict[tuple[str, Kind], list[str]] = {}
    for member in members:
        if not is_live(member, now, grace):
            continue
        for replica_id, info in member.replicas.items():
            if not model or info.model == model:
                out.setdefault((info.model, kind_of(info)), []).append(replica_id)
    return {key: sorted(ids) for key, ids in out.items()}


def engine_view(kind_fit: KindFit) -> admin_pb2.EngineFitView:
    """One (model, kind) on the wire."""
    fit, facts = kind_fit.fit, kind_fit.facts
    params = [admin_pb2.EngineParamView(
        name=p.name, value=p.value if p.value is not None else NAN,
        stderr=p.stderr if p.stderr is not None else NAN, identifiable=p.identifiable, reason=p.reason)
        for p in fit.params]
    assert [p.name for p in params] == list(PARAMS)
    return admin_pb2.EngineFitView(
        model=kind_fit.model, kind=str(kind_fit.kind), engine=kind_fit.kind.engine, gpus=kind_fit.kind.gpus,
        version=kind_fit.kind.version, replica_ids=list(kind_fit.replica_ids), samples=fit.samples,
        sampled_replicas=len(kind_fit.replica_ids),
        window_seconds=kind_fit.window_seconds, params=params,
        relative_rms=fit.relative_rms if fit.relative_rms is not None else NAN,
        r2=fit.r2 if fit.r2 is not None else NAN, step_seconds=fit.step_seconds,
        kv_blocks_total=facts.kv_blocks_total, kv_block_tokens=facts.kv_block_tokens,
        max_running=facts.max_running, max_step_tokens=facts.max_step_tokens, unchunked=facts.unchunked,
        prefix_cache_blocks=facts.prefix_cache_blocks)
