"""The control plane's Prometheus metrics, in a registry of its own choosing.

``ferry controlplane`` passes the default registry (served by
``ferry.metrics.start_metrics_server``); tests give each control plane a fresh
one. Labels are bounded: regions, replica states, reasons (a fixed set) and
proxy ids (at most ``max_proxies``; a forgotten proxy's series are removed).

| metric | type | labels |
| --- | --- | --- |
| ``ferry_controlplane_members`` | gauge: live nodes | |
| ``ferry_controlplane_replicas`` | gauge: replicas known | region, state (``warming`` … ``dead``) |
| ``ferry_controlplane_table_version`` | gauge | region |
| ``ferry_controlplane_spill_weight`` | gauge: share of a region's interactive traffic spilled | source, target |
| ``ferry_controlplane_table_pushes_total`` | counter: snapshots sent to proxies | region |
| ``ferry_controlplane_proxy_applied_version`` | gauge | proxy |
| ``ferry_controlplane_proxy_lag_versions`` | gauge | proxy |
| ``ferry_controlplane_proxy_behind_seconds`` | gauge: seconds not connected and in sync (0: fine) | proxy |
| ``ferry_controlplane_proxies_disconnected`` | gauge: proxies remembered whose stream is gone | region |
| ``ferry_controlplane_telemetry_age_seconds`` | histogram: each routable replica's load age, once a second | |
| ``ferry_controlplane_telemetry_messages_total`` | counter | |
| ``ferry_controlplane_table_compute_seconds`` | histogram: one recomputation (compute, version, offer) | |
| ``ferry_controlplane_leader`` | gauge: 1 while this control plane computes the tables | |
| ``ferry_controlplane_store_up`` | gauge: 1 while the store's last calls succeeded, 0 while unreachable | |
| ``ferry_controlplane_rejected_messages_total`` | counter: messages or entries refused or ignored | reason |
| ``ferry_controlplane_kv_utilisation`` | gauge: used / total KV blocks of routable replicas | region, model |
| ``ferry_controlplane_gpu_utilisation`` | gauge: mean GPU utilisation of routable replicas | region, model |
| ``ferry_controlplane_telemetry_max_age_seconds`` | gauge: oldest load among routable replicas | region |
| ``ferry_controlplane_node_gpus`` | gauge: GPUs of live nodes, ``held`` or ``free`` | region, state |
| ``ferry_controlplane_cordoned_nodes`` | gauge | region |
| ``ferry_controlplane_alloc_pending`` | gauge: allocation requests waiting for a node | |
| ``ferry_controlplane_alloc_oldest_pending_seconds`` | gauge: age of the oldest (0: none) | |
| ``ferry_controlplane_alloc_placements_total`` | counter: replicas placed, by planner branch | branch |
| ``ferry_controlplane_alloc_displaced_replicas_total`` | counter: small replicas drained to make room | |
| ``ferry_region_requests_per_second`` | gauge: requests ended per second (proxies' reports) | model, region, tier |
| ``ferry_region_p99_seconds`` | gauge: p99 of requests answered OK (highest proxy's) | model, region, tier |
| ``ferry_region_shed_ratio`` | gauge: shed / offered requests, 0..1 | model, region, tier |
| ``ferry_scaling_replicas`` | gauge: the scaling plan (leader only; ``kind``: see below) | model, region, kind |
| ``ferry_scaling_arrival_rate`` | gauge: requests/s offered, as the plan read it | model, region |
| ``ferry_scaling_forecast_rate`` | gauge: peak requests/s of the hours ahead on previous days | model, region |
| ``ferry_scaling_standby_nodes`` | gauge: nodes with no replica (warm pool): ``current``, ``to_keep`` | region, kind |
| ``ferry_scaling_startup_seconds`` | gauge: measured time to bring a replica up (else the default) | region |
| ``ferry_scaling_replacement_seconds`` | gauge: measured time to replace a machine (else the default) | region |

``ferry_scaling_replicas``'s ``kind`` is one of ``current``, ``ready``,
``needed_now``, ``needed_for_ramp``, ``desired``, ``promote``
(:mod:`controlplane.scaling`). An autoscaler (a Kubernetes HPA external metric, KEDA) scales a model's
deployment on ``ferry_scaling_replicas{kind="desired"}`` and the standby pool
on ``ferry_scaling_standby_nodes{kind="to_keep"}`` (docs/operations.md).

The ``ferry_region_*`` series are the leader's merge of every proxy's last
usage report (:mod:`controlplane.tables.usage`); a follower exports none of them.

Models and regions are bounded by the catalog and the fleet; a pair that
disappears loses its series at the next observation.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controlplane.allocation.gang import BRANCHES, Placement
from controlplane.fleet.view import Member, is_live, load_of, replica_state
from controlplane.tables.compute import TableVersions
from controlplane.tables.usage import Figures
from controlplane.tables.watchers import ProxyStatus
from ferry.metrics import name
from ferry.v1 import admin_pb2, common_pb2

STATE_NAMES = {v: k.removeprefix("REPLICA_STATE_").lower() for k, v in common_pb2.ReplicaState.items()}

COMPUTE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
AGE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)


class Metrics:
    """Every metric of one control plane, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry  # for the collectors of a concern of its own (controlplane.traffic)
        self.members = Gauge(name("controlplane_members"), "Live nodes in the fleet.", registry=registry)
        self.spill_weight = Gauge(name("controlplane_spill_weight"),
                                  "Share of a region's interactive traffic spilled to another (tables.spill).",
                                  ["source", "target"], registry=registry)
        self.tier_quota = Gauge(name("controlplane_tier_quota"), "Concurrency slots a tier may run (table quota).",
                                ["region", "tier"], registry=registry)
        self.replicas = Gauge(
            name("controlplane_replicas"), "Replicas known, by region and state.", ["region", "state"],
            registry=registry,
        )
        self.table_version = Gauge(
            name("controlplane_table_version"), "Current table version of each region.", ["region"],
            registry=registry,
        )
        self.table_pushes = Counter(
            name("controlplane_table_pushes"), "Table snapshots sent to proxies.", ["region"], registry=registry,
        )
        self.proxy_applied_version = Gauge(
            name("controlplane_proxy_applied_version"), "Table version each proxy last applied.", ["proxy"],
            registry=registry,
        )
        self.proxy_lag_versions = Gauge(
            name("controlplane_proxy_lag_versions"), "Versions each proxy is behind its region.", ["proxy"],
            registry=registry,
        )
        self.proxy_behind = Gauge(
            name("controlplane_proxy_behind_seconds"), "Seconds each proxy has not been connected with its "
            "region's current table applied (0: connected and in sync).", ["proxy"], registry=registry,
        )
        self.proxies_disconnected = Gauge(
            name("controlplane_proxies_disconnected"), "Proxies remembered here whose table stream is gone.",
            ["region"], registry=registry,
        )
        self.telemetry_age = Histogram(
            name("controlplane_telemetry_age_seconds"), "Age of routable replicas' load at each table computation.",
            buckets=AGE_BUCKETS, registry=registry,
        )
        self.telemetry_messages = Counter(
            name("controlplane_telemetry_messages"), "Telemetry messages received from agents.", registry=registry,
        )
        self.table_compute = Histogram(
            name("controlplane_table_compute_seconds"), "Time to compute, version and offer every region's table.",
            buckets=COMPUTE_BUCKETS, registry=registry,
        )
        self.leader = Gauge(name("controlplane_leader"), "1 while this control plane computes the tables.",
                            registry=registry)
        self.store_up = Gauge(name("controlplane_store_up"),
                              "1 while the store's last calls succeeded, 0 while it is unreachable.", registry=registry)
        self.rejected = Counter(
            name("controlplane_rejected_messages"), "Messages or entries refused or ignored, by reason.", ["reason"],
            registry=registry,
        )

        self.kv_utilisation = Gauge(
            name("controlplane_kv_utilisation"), "Used / total KV-cache blocks of routable replicas, 0..1.",
            ["region", "model"], registry=registry,
        )
        self.gpu_utilisation = Gauge(
            name("controlplane_gpu_utilisation"), "Mean GPU utilisation of routable replicas, 0..1.",
            ["region", "model"], registry=registry,
        )
        self.telemetry_max_age = Gauge(
            name("controlplane_telemetry_max_age_seconds"), "Age of the oldest load among a region's routable "
            "replicas at the last computation.", ["region"], registry=registry,
        )
        self.node_gpus = Gauge(
            name("controlplane_node_gpus"), "GPUs of live nodes, held (by replicas or allocations) or free.",
            ["region", "state"], registry=registry,
        )
        self.cordoned_nodes = Gauge(name("controlplane_cordoned_nodes"), "Cordoned nodes.", ["region"],
                                    registry=registry)
        self.alloc_pending = Gauge(name("controlplane_alloc_pending"), "Allocation requests waiting for a node.",
                                   registry=registry)
        self.alloc_oldest = Gauge(
            name("controlplane_alloc_oldest_pending_seconds"), "Age of the oldest waiting allocation request.",
            registry=registry,
        )
        self.alloc_placements = Counter(
            name("controlplane_alloc_placements"), "Replicas placed by the gang allocator, by branch.", ["branch"],
            registry=registry,
        )
        self.alloc_displaced = Counter(
            name("controlplane_alloc_displaced_replicas"), "Small replicas drained to make room for a large one.",
            registry=registry,
        )
        for branch in BRANCHES:
            self.alloc_placements.labels(branch=branch)
        labels = ["model", "region", "tier"]
        self.region_rate = Gauge(name("region_requests_per_second"), "Requests ended per second (proxies' reports).",
                                 labels, registry=registry)
        self.region_p99 = Gauge(name("region_p99_seconds"), "p99 of requests answered OK (the highest proxy's).",
                                labels, registry=registry)
        self.region_shed = Gauge(name("region_shed_ratio"), "Shed / offered requests, 0..1 (proxies' reports).",
                                 labels, registry=registry)

        self.scaling_replicas = Gauge(
            name("scaling_replicas"), "The scaling plan per model and region (controlplane.scaling): current, "
            "ready, needed_now, needed_for_ramp, desired, promote.", ["model", "region", "kind"], registry=registry)
        self.scaling_arrival = Gauge(name("scaling_arrival_rate"), "Requests/s offered, as the scaling plan read it.",
                                     ["model", "region"], registry=registry)
        self.scaling_forecast = Gauge(name("scaling_forecast_rate"), "Peak requests/s of the hours ahead on "
                                      "previous days (0: no history).", ["model", "region"], registry=registry)
        self.scaling_standby = Gauge(name("scaling_standby_nodes"), "Standby nodes (no replica): current and to keep.",
                                     ["region", "kind"], registry=registry)
        self.scaling_startup = Gauge(name("scaling_startup_seconds"), "Measured time to bring a replica up.",
                                     ["region"], registry=registry)
        self.scaling_replacement = Gauge(name("scaling_replacement_seconds"), "Measured time to replace a machine.",
                                         ["region"], registry=registry)

        self._proxies: set[str] = set()

    def placed(self, placement: Placement) -> None:
        self.alloc_placements.labels(branch=placement.branch).inc()
        self.alloc_displaced.inc(len(placement.slot.displaces))

    def observe_usage(self, rows: Iterable[admin_pb2.UsageRow],
                      aged: Iterable[admin_pb2.UsageRow] | None = None) -> None:
        """KV and GPU utilisation per region and model, oldest telemetry per region.

        ``aged``: the rows whose telemetry age this control plane measures itself (a follower: the
        nodes held here); None: ``rows``. A follower's copy of the leader's loads has no age of its own.
        """
        rows = list(rows)
        self.kv_utilisation.clear()
        self.gpu_utilisation.clear()
        self.telemetry_max_age.clear()
        ages: dict[str, float] = {}
        for row in rows:
            if not row.replicas_ready:
                continue
            self.kv_utilisation.labels(region=row.region, model=row.model).set(row.kv_utilisation)
            self.gpu_utilisation.labels(region=row.region, model=row.model).set(row.gpu_utilisation)
        for row in rows if aged is None else aged:
            if row.replicas_ready:
                ages[row.region] = max(ages.get(row.region, 0.0), row.telemetry_age_seconds)
        for region, age in ages.items():
            self.telemetry_max_age.labels(region=region).set(age)

    def observe_region_usage(self, figures: Mapping[tuple[str, str, str], Figures]) -> None:
        """The merged proxy reports per (model, region, tier); pairs no longer reported lose their series."""
        for gauge in (self.region_rate, self.region_p99, self.region_shed):
            gauge.clear()
        for (model, region, tier), f in figures.items():
            self.region_rate.labels(model=model, region=region, tier=tier).set(f.request_rate)
            self.region_p99.labels(model=model, region=region, tier=tier).set(f.p99_seconds)
            self.region_shed.labels(model=model, region=region, tier=tier).set(f.shed_rate)

    def observe_nodes(self, nodes: Iterable[admin_pb2.NodeView], pending: Iterable[float]) -> None:
        """GPUs held and free per region (live nodes), cordoned nodes, and the requests' ages."""
        gpus: Tally[tuple[str, str]] = Tally()
        cordoned: Tally[str] = Tally()
        for node in nodes:
            cordoned[node.region] += node.cordoned
            if node.live:
                gpus[node.region, "held"] += node.gpus_allocated
                gpus[node.region, "free"] += node.gpus_free
        self.node_gpus.clear()
        for (region, state), count in gpus.items():
            self.node_gpus.labels(region=region, state=state).set(count)
        self.cordoned_nodes.clear()
        for region, count in cordoned.items():
            self.cordoned_nodes.labels(region=region).set(count)
        ages = list(pending)
        self.alloc_pending.set(len(ages))
        self.alloc_oldest.set(max(ages, default=0.0))

    def observe_scaling(self, views: Iterable[admin_pb2.ScaleView], standby: Iterable[admin_pb2.StandbyView]) -> None:
        """The last scaling plan; pairs and regions no longer planned lose their series."""
        for gauge in (self.scaling_replicas, self.scaling_arrival, self.scaling_forecast, self.scaling_standby,
                      self.scaling_startup, self.scaling_replacement):
            gauge.clear()
        for v in views:
            for kind in ("current", "ready", "needed_now", "needed_for_ramp", "desired", "promote"):
                self.scaling_replicas.labels(model=v.model, region=v.region, kind=kind).set(getattr(v, kind))
            self.scaling_arrival.labels(model=v.model, region=v.region).set(v.arrival_rate)
            self.scaling_forecast.labels(model=v.model, region=v.region).set(v.forecast_rate)
        for r in standby:
            self.scaling_standby.labels(region=r.region, kind="current").set(r.standby_nodes)
            self.scaling_standby.labels(region=r.region, kind="to_keep").set(r.standby_to_keep)
            self.scaling_startup.labels(region=r.region).set(r.startup_seconds)
            self.scaling_replacement.labels(region=r.region).set(r.replacement_seconds)

    def reject(self, reason: str, count: int = 1) -> None:
        self.rejected.labels(reason=reason).inc(count)

    def observe_fleet(self, members: Iterable[Member], tables: TableVersions, *, now: float, grace: float,
                      aged: AbstractSet[str] | None = None) -> None:
        """Members, replicas by region and state, and the load age of each routable replica, at ``now``.

        ``aged``: the nodes whose load age is observed (a follower: those held here); None: all.
        """
        live = 0
        counts: Tally[tuple[str, str]] = Tally()
        for member in members:
            alive = is_live(member, now, grace)
            live += alive
            published = tables.get(member.region)
            for replica_id in member.replicas:
                counts[member.region, STATE_NAMES[replica_state(member, replica_id, alive)]] += 1
                if published is not None and replica_id in published.replica_ids and (
                        aged is None or member.node in aged):
                    self.telemetry_age.observe(load_of(member, replica_id, now)[1])
        self.members.set(live)
        self.replicas.clear()
        for (region, state), count in counts.items():
            self.replicas.labels(region=region, state=state).set(count)

    def observe_proxy(self, status: ProxyStatus, tables: TableVersions, *, now: float) -> None:
        """One proxy's applied version, lag and time behind (an ack: the others did not change)."""
        current = tables.get(status.region)
        lag = status.lag(current.version) if current is not None else 0
        self.proxy_applied_version.labels(proxy=status.proxy_id).set(status.applied_version)
        self.proxy_lag_versions.labels(proxy=status.proxy_id).set(lag)
        if not status.connected:
            behind = now - status.last_seen
        elif lag:
            behind = now - (status.subscribed_at if status.last_ack_at is None else status.last_ack_at)
        else:
            behind = 0.0
        self.proxy_behind.labels(proxy=status.proxy_id).set(max(0.0, behind))

    def observe_proxies(self, statuses: Iterable[ProxyStatus], tables: TableVersions, *, now: float) -> None:
        """Applied version, lag and time behind of every proxy remembered; forgotten ones lose their series.

        Behind: 0 while connected with the region's current version applied; else the seconds since
        it last was (since its last ack while connected but lagging, since its stream ended when gone).
        """
        seen = set()
        disconnected: Tally[str] = Tally()
        for status in statuses:
            seen.add(status.proxy_id)
            self.observe_proxy(status, tables, now=now)
            disconnected[status.region] += not status.connected
        for proxy in self._proxies - seen:
            self.proxy_applied_version.remove(proxy)
            self.proxy_lag_versions.remove(proxy)
            self.proxy_behind.remove(proxy)
        self._proxies = seen
        self.proxies_disconnected.clear()
        for region, count in disconnected.items():
            self.proxies_disconnected.labels(region=region).set(count)
