"""Router config rollouts: the store writes, the tables' router part, and the leader's guard tick.

:class:`RouterService`:

- :meth:`RouterService.rollout` (``Admin.RouterRollout``): checks the
  candidate's text (:func:`ferry.routerconfig.parse`: the ``[proxy]``
  section, live keys only; INVALID_ARGUMENT naming ``proxy.<key>``), the
  share and the guard; stores the text as a new version (or finds the stored
  version with the same digest), then the rollout record, baseline = the
  version the proxies run by default now; refused while a rollout is in
  canary. Writes go through the :class:`controlplane.intent.writer.IntentWriter`
  (refused while the store is unreachable, conditional on what was read);
  the call returns once the tables held here carry the assignment.
- :meth:`RouterService.decide` (``Admin.RouterDecide``): promote or roll back
  by hand.
- :meth:`RouterService.attach`: called by the table computation
  (:meth:`controlplane.services.tables.TableService.recompute`) for every
  region's table: the versions, the canary proxies
  (:func:`controlplane.routerconfig.records.assign` over the proxies watching
  here) and the default.
- :meth:`RouterService.run`: the leader's tick (every ``TICK_SECONDS``,
  0.25 s): a proxy that refused the candidate rolls the rollout back at
  once; the proxies' usage reports (:class:`controlplane.tables.usage.ProxyUsage`,
  one per proxy per second) are summed per group, a group being the version
  the report says ran for its whole window (``UsageSample.router_version``,
  not ``router_mixed``); every ``guard.window_seconds`` the window is judged
  and the sequential test steps (:mod:`controlplane.routerconfig.guard`);
  its decision is written as the rollout's new state.

The test's state lives in the leader's memory: a new leader starts it from 0
(the rollout's start time is in the record, so ``min_seconds`` and
``max_seconds`` still count from the start); a decision waits at most one
more test. Proxies watching a follower get the default version (they are
not among the leader's watchers, so none is a canary).

Bounds: :data:`records.MAX_CONFIGS` versions in the store; one rollout at a
time; per proxy the time of the last report read (pruned to the live ones).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping

from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import KEEP, Edit, IntentWriter
from controlplane.routerconfig import guard as sprt
from controlplane.routerconfig.records import (
    ABORTED,
    CANARY,
    CONFIG_PREFIX,
    MAX_CONFIGS,
    PROMOTED,
    ROLLED_BACK,
    ROLLOUT_KEY,
    RouterConfig,
    RouterRollout,
    assign,
    config_key,
    router_part,
)
from controlplane.services.peers import PeerService
from controlplane.store.base import KeyValue
from controlplane.tables.compute import TableVersions
from controlplane.tables.usage import ProxyUsage
from controlplane.tables.watchers import Watchers
from ferry.errors import ConfigError, InvalidArgument, NotFound, Unavailable
from ferry.logs import event
from ferry.routerconfig import digest, parse
from ferry.v1 import admin_pb2, tables_pb2

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25


@dataclasses.dataclass(slots=True)
class Running:
    """The leader's test of one rollout: the window being summed, the SPRT, the figures shown."""

    rollout_id: int
    window_start: float
    canary: sprt.Group = dataclasses.field(default_factory=sprt.Group)
    baseline: sprt.Group = dataclasses.field(default_factory=sprt.Group)
    test: sprt.Test = dataclasses.field(default_factory=sprt.Test)
    totals: dict[str, sprt.Group] = dataclasses.field(default_factory=lambda: {"canary": sprt.Group(),
                                                                                  "baseline": sprt.Group()})
    last: dict[str, sprt.Group] = dataclasses.field(default_factory=dict)  # the last window counted


class RouterService:
    """Router config versions, the rollout, the guard; see the module docstring."""

    def __init__(self, *, intent: IntentCache, writer: IntentWriter, watchers: Watchers, usage: ProxyUsage,
                 peers: PeerService, tables: TableVersions, clock: Callable[[], float],
                 wall: Callable[[], float], notify: Callable[[], None]) -> None:
        self._intent = intent
        self._writer = writer
        self._watchers = watchers
        self._usage = usage
        self._peers = peers
        self._tables = tables
        self._clock = clock
        self._wall = wall
        self._notify = notify
        self._read: dict[str, float] = {}  # proxy id -> made_at of the last report read
        self.running: Running | None = None

    # -- the records, as mirrored here

    def configs(self) -> dict[int, RouterConfig]:
        out = {}
        for key, kv in self._intent.mirror.items.items():
            if key.startswith(CONFIG_PREFIX):
                try:
                    config = RouterConfig.decode(key, kv.value)
                except ValueError as exc:
                    log.warning("%s", exc)
                    continue
                out[config.version] = config
        return out

    def current(self) -> RouterRollout | None:
        kv = self._intent.mirror.get(ROLLOUT_KEY)
        return _decode(kv)

    def default_version(self) -> int:
        rollout = self.current()
        return rollout.default_version if rollout is not None else 0

    # -- the tables

    def canaries(self, rollout: RouterRollout | None) -> dict[str, list[str]]:
        """Region -> the proxies watching here that run the candidate."""
        regions: dict[str, list[str]] = {}
        for status in self._watchers.statuses():
            if status.connected:
                regions.setdefault(status.region, []).append(status.proxy_id)
        return assign(rollout, regions)

    def attach(self, tables: Mapping[str, tables_pb2.TableSnapshot]) -> None:
        """Every region's router part (see the module docstring)."""
        rollout, configs = self.current(), self.configs()
        if rollout is None and not configs:
            return
        named = self.canaries(rollout)
        for region, table in tables.items():
            router_part(table, rollout, named.get(region, ()), configs)

    # -- operator calls

    async def rollout(self, request: admin_pb2.RouterRolloutRequest) -> admin_pb2.RouterRolloutView:
        try:
            parse(request.text)
        except ConfigError as exc:
            raise InvalidArgument(exc.key, exc.reason) from None
        percent = request.canary_percent
        if not math.isfinite(percent) or not 0 < percent <= 100:
            raise InvalidArgument("canary_percent", f"{percent} is not in (0, 100]")
        guard = guard_of(request.guard)
        current = self.current()
        if current is not None and current.state == CANARY:
            raise InvalidArgument("rollout", f"rollout {current.id} of version {current.candidate} is in canary: "
                                             "promote or roll it back first")
        baseline = current.default_version if current is not None else 0
        configs = self.configs()
        text_digest = digest(request.text)
        if baseline and configs.get(baseline) is not None and configs[baseline].digest == text_digest:
            raise InvalidArgument("text", f"the same config as version {baseline}, which the proxies run now")
        same = [c.version for c in configs.values() if c.digest == text_digest]
        now = self._wall()
        if same:
            version = same[0]
        else:
            version = max(configs, default=0) + 1
            config = RouterConfig(version, request.text, text_digest, now)

            def put(kv: KeyValue | None) -> Edit:
                if kv is not None:
                    raise Unavailable(f"router config version {version} was stored meanwhile: try again")
                return config.encode()
            await self._writer.change("router config", config_key(version), put)
            await self._prune(configs, keep={baseline, version})
        started: list[RouterRollout] = []

        def edit(kv: KeyValue | None) -> Edit:
            held = _decode(kv)
            if held is not None and held.state == CANARY:
                raise InvalidArgument("rollout", f"rollout {held.id} is in canary: promote or roll it back first")
            base = held.default_version if held is not None else 0
            record = RouterRollout(id=(held.id + 1) if held is not None else 1, baseline=base, candidate=version,
                                   share=percent / 100.0, guard=guard, state=CANARY, reason="started",
                                   started_at=now, updated_at=now)
            started.append(record)
            return record.encode()
        await self._writer.change("router rollout", ROLLOUT_KEY, edit)
        record = started[-1]
        event(log, "router_rollout_started", id=record.id, baseline=record.baseline, candidate=record.candidate,
              share=record.share)
        await self._writer.settle(lambda: self._reflected(record))
        return self.view(record)

    async def decide(self, request: admin_pb2.RouterDecideRequest) -> admin_pb2.RouterRolloutView:
        if request.action == admin_pb2.RouterDecideRequest.ACTION_PROMOTE:
            state = PROMOTED
        elif request.action == admin_pb2.RouterDecideRequest.ACTION_ROLLBACK:
            state = ROLLED_BACK
        else:
            raise InvalidArgument("action", "promote or rollback")
        reason = request.reason or f"{'promoted' if state == PROMOTED else 'rolled back'} by the operator"
        record = await self._decide(None, state, reason[:1024])
        if record is None:
            raise NotFound("router rollout in canary", "any")
        await self._writer.settle(lambda: self._reflected(record))
        return self.view(record)

    async def _decide(self, rollout_id: int | None, state: str, reason: str) -> RouterRollout | None:
        """Write ``state`` on the rollout in canary (of ``rollout_id`` when given); None when there is none."""
        done: list[RouterRollout] = []
        now = self._wall()

        def edit(kv: KeyValue | None) -> Edit:
            held = _decode(kv)
            done.clear()
            if held is None or held.state != CANARY or (rollout_id is not None and held.id != rollout_id):
                return KEEP
            done.append(held.decided(state, reason, now))
            return done[-1].encode()
        await self._writer.change(f"router rollout {state}", ROLLOUT_KEY, edit)
        if done:
            event(log, "router_rollout_decided", logging.WARNING if state != PROMOTED else logging.INFO,
                  id=done[0].id, candidate=done[0].candidate, state=state, reason=reason)
            self._notify()
        return done[0] if done else None

    async def _prune(self, configs: dict[int, RouterConfig], keep: set[int]) -> None:
        """Delete the oldest versions beyond MAX_CONFIGS that ``keep`` does not name."""
        spare = sorted(v for v in configs if v not in keep)
        for version in spare[:max(0, len(configs) + 1 - MAX_CONFIGS)]:
            await self._writer.change("router config prune", config_key(version), lambda kv: None)

    def _reflected(self, record: RouterRollout) -> bool:
        """Whether every table held here carries ``record``'s default (and, in canary, its assignments)."""
        named = self.canaries(record)
        for region in self._tables.regions():
            published = self._tables.get(region)
            if published is None:
                continue
            table = published.snapshot
            if table.router_default != record.default_version:
                return False
            if sorted(a.proxy_id for a in table.router_assignments) != named.get(region, []):
                return False
        return True

    # -- the guard

    async def run(self) -> None:
        """The leader's tick until cancelled."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await self.tick()
            except Unavailable as exc:
                event(log, "router_guard_write_failed", logging.WARNING, reason=str(exc))
            except Exception:  # the loop outlives a bug in one tick
                log.exception("router guard tick failed")

    async def tick(self) -> None:
        """One look: refusals, reports, a window judged, a decision written."""
        rollout = self.current()
        if not self._peers.leading or rollout is None or rollout.state != CANARY:
            self.running = None
            return
        now = self._clock()
        running = self.running
        if running is None or running.rollout_id != rollout.id:
            running = self.running = Running(rollout.id, window_start=now)
        if rollout.candidate not in self.configs():
            await self._decide(rollout.id, ABORTED, f"version {rollout.candidate} is no longer in the store")
            return
        for status in self._watchers.statuses():
            if status.router_refused == rollout.candidate:
                await self._decide(rollout.id, ROLLED_BACK, f"proxy {status.proxy_id} refused version "
                                                            f"{rollout.candidate}: {status.router_error}")
                return
        self._read_reports(rollout, running)
        if now - running.window_start >= rollout.guard.window_seconds:
            verdict = sprt.judge(rollout.guard, running.canary, running.baseline)
            if verdict is not None:
                running.test.step(verdict)
                running.last = {"canary": running.canary, "baseline": running.baseline}
            running.canary, running.baseline, running.window_start = sprt.Group(), sprt.Group(), now
        decision = sprt.decide(rollout.guard, running.test, self._wall() - rollout.started_at)
        if decision is not None:
            action, reason = decision
            await self._decide(rollout.id, PROMOTED if action == sprt.PROMOTE else ROLLED_BACK, reason)

    def _read_reports(self, rollout: RouterRollout, running: Running) -> None:
        """Add the reports not read yet to the window, each to the group of the version it ran."""
        seen = {}
        for entry in self._usage.entries():
            seen[entry.proxy_id] = entry.made_at
            if entry.made_at <= self._read.get(entry.proxy_id, float("-inf")):
                continue
            for sample in entry.report.usage:
                if sample.router_mixed:
                    continue
                if sample.router_version == rollout.candidate:
                    name, group = "canary", running.canary
                elif sample.router_version == rollout.baseline:
                    name, group = "baseline", running.baseline
                else:
                    continue
                figures = (sample.requests, sample.errors, sample.ttft_samples, sample.ttft_p99_seconds,
                           sample.ttft_p50_seconds)
                group.add(*figures)
                running.totals[name].add(*figures)
        self._read = seen

    # -- views

    def view(self, rollout: RouterRollout) -> admin_pb2.RouterRolloutView:
        guard = rollout.guard
        out = admin_pb2.RouterRolloutView(
            id=rollout.id, baseline_version=rollout.baseline, candidate_version=rollout.candidate,
            canary_percent=rollout.share * 100.0, guard=admin_pb2.RouterGuard(**dataclasses.asdict(guard)),
            state=rollout.state, reason=rollout.reason, started_at=rollout.started_at,
            updated_at=rollout.updated_at, decided_at=rollout.decided_at,
            rollback_at=sprt.ROLLBACK_AT, promote_at=sprt.PROMOTE_AT)
        running = self.running
        if running is not None and running.rollout_id == rollout.id:
            out.llr, out.windows, out.bad_windows = running.test.llr, running.test.windows, running.test.bad
            for name, target in (("canary", out.canary), ("baseline", out.baseline)):
                total, last = running.totals[name], running.last.get(name)
                target.requests, target.errors = total.requests, total.errors
                if last is not None:
                    target.ttft_p99_seconds, target.ttft_p50_seconds = last.ttft_p99, last.ttft_p50
        return out

    def get(self, request: admin_pb2.GetRouterRequest) -> admin_pb2.GetRouterResponse:
        rollout, configs = self.current(), self.configs()
        out = admin_pb2.GetRouterResponse(default_version=rollout.default_version if rollout is not None else 0)
        for version in sorted(configs):
            config = configs[version]
            out.configs.add(version=version, digest=config.digest, created_at=config.created_at)
        if request.version:
            asked = configs.get(request.version)
            if asked is None:
                raise NotFound("router config version", str(request.version))
            out.config.CopyFrom(admin_pb2.RouterConfigView(version=asked.version, digest=asked.digest,
                                                           created_at=asked.created_at, text=asked.text))
        if rollout is not None:
            out.rollout.CopyFrom(self.view(rollout))
        named = {pid for ids in self.canaries(rollout).values() for pid in ids}
        default = out.default_version
        for status in self._watchers.statuses():
            canary = status.proxy_id in named and rollout is not None
            out.proxies.add(proxy_id=status.proxy_id, region=status.region, connected=status.connected,
                            assigned_version=rollout.candidate if canary and rollout is not None else default,
                            applied_version=status.router_version, error=status.router_error, canary=canary)
        return out


def guard_of(given: admin_pb2.RouterGuard) -> sprt.Guard:
    """The guard asked for, its unset (0) fields the defaults; InvalidArgument naming ``guard.<field>``."""
    values = {f.name: getattr(given, f.name) for f in dataclasses.fields(sprt.Guard) if getattr(given, f.name)}
    try:
        return sprt.Guard(**values).check()
    except ValueError as exc:
        name, _, reason = str(exc).partition(": ")
        raise InvalidArgument(name, reason) from None


def _decode(kv: KeyValue | None) -> RouterRollout | None:
    if kv is None:
        return None
    try:
        return RouterRollout.decode(kv.value)
    except ValueError as exc:
        log.warning("%s", exc)
        return None

