"""Model version rollouts: start (canary), advance (promote), abort (roll back), and their views.

:class:`RolloutService` is the store edge of :mod:`controlplane.rollout.plan`
(which holds the policy). :meth:`RolloutService.rollout` validates
(INVALID_ARGUMENT naming ``model``, ``version``, ``canary_percent`` or
``action``; NOT_FOUND for a model outside the catalog, or a promote / roll
back with no rollout), then writes the next record through the
:class:`controlplane.intent.writer.IntentWriter` (refused while the store is
unreachable; ``put_if`` on the revision read, bounded retries; nothing written
when the record does not change), which returns once the leader's tables
carry the rollout's default version and weights. The answer shows, per
region, the replicas of each version routable and the canary's share.
:meth:`RolloutService.list_rollouts`: every rollout record (optionally one
model's), sorted by model, each with the same per-region view.

State: none (the records live in the store, mirrored by the intent cache).
Dependencies: the settings, the catalog, the wall clock, the intent cache,
the intent writer, the peers (the merged members, for the catalog) and the
table versions. Cost: O(regions x models) per answer, besides the store calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from controlplane import validate
from controlplane.config import ControlPlaneSettings
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import KEEP, Edit, IntentWriter
from controlplane.rollout import plan as rollout
from controlplane.rollout.plan import Rollout
from controlplane.services.peers import PeerService
from controlplane.store.base import KeyValue, rollout_key
from controlplane.tables.compute import TableVersions, catalog_models
from ferry.config import ModelConfig
from ferry.errors import InvalidArgument, NotFound
from ferry.v1 import admin_pb2

log = logging.getLogger(__name__)

ACTIONS = {
    admin_pb2.RolloutRequest.ACTION_CANARY: rollout.Action.CANARY,
    admin_pb2.RolloutRequest.ACTION_PROMOTE: rollout.Action.PROMOTE,
    admin_pb2.RolloutRequest.ACTION_ROLLBACK: rollout.Action.ROLLBACK,
}


class RolloutService:
    """Writes rollout records and shows them against the tables.

    State: none. Dependencies: settings, catalog, the wall clock, the intent cache, the intent writer,
    the peer service (members, for the catalog), the table versions.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        catalog: Sequence[ModelConfig],
        intent: IntentCache,
        writer: IntentWriter,
        peers: PeerService,
        tables: TableVersions,
        wall: Callable[[], float],
    ) -> None:
        self.settings = settings
        self._catalog = tuple(catalog)
        self._intent = intent
        self._writer = writer
        self._peers = peers
        self._tables = tables
        self._wall = wall

    def list_rollouts(self, model: str) -> list[admin_pb2.RolloutView]:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        records = [r for m, r in sorted(self._intent.rollouts.items()) if not model or m == model]
        return [self.view(r) for r in records]

    async def rollout(self, request: admin_pb2.RolloutRequest) -> admin_pb2.RolloutView:
        s = self.settings
        action = ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgument("action", "required: canary, promote or rollback")
        validate.check_name(request.model, "model", s.max_name_bytes)
        validate.check_filter(request.version, "version", s.max_version_bytes)
        if action is rollout.Action.CANARY:
            rollout.check_percent(request.canary_percent)
        model = next((m for m in catalog_models(self._catalog, self._peers.members()) if m.name == request.model),
                     None)
        if model is None:
            raise NotFound("model", request.model)
        records: list[Rollout] = []

        def edit(kv: KeyValue | None) -> Edit:
            current: Rollout | None = None
            if kv is not None:
                try:
                    current = Rollout.decode(request.model, kv.value)
                except ValueError as exc:
                    log.warning("%s; replaced by this rollout", exc)
            record = rollout.transition(
                current, model=request.model, action=action, version=request.version,
                percent=request.canary_percent, catalog_default=model.default_version, now=self._wall(),
                max_name_bytes=s.max_name_bytes, max_version_bytes=s.max_version_bytes,
            )
            records.append(record)
            if record == current and kv is not None:
                return KEEP  # nothing to write: promote or roll back again
            return record.encode()

        await self._writer.write(f"rollout of {request.model}", rollout_key(request.model), edit,
                                 reflected=lambda: self._reflects(request.model))
        record = records[-1]
        log.info("rollout of %s: %s, stable %s, canary %s at %g %%", record.model, record.state, record.stable,
                 record.canary, record.weight * 100)
        return self.view(record)

    def _reflects(self, model: str) -> bool:
        """Every region's route of ``model`` has the default version and weights the stored rollout gives."""
        record = self._intent.rollouts.get(model)
        if record is None:
            return True
        for region in self._tables.regions():
            published = self._tables.get(region)
            route = next((m for m in published.snapshot.models if m.model == model), None) if published else None
            if route is None:
                continue
            default, weights = rollout.route_weights(record, {r.version for r in route.replicas})
            if route.default_version != default or [(w.version, w.weight) for w in route.version_weights] != weights:
                return False
        return True

    def view(self, record: Rollout) -> admin_pb2.RolloutView:
        """The record with, per region, the routable replicas of both versions and the canary's share now."""
        view = admin_pb2.RolloutView(
            model=record.model, stable_version=record.stable, canary_version=record.canary,
            canary_percent=round(record.weight * 100.0, 6), state=record.state, updated_at=record.updated_at,
            default_version=record.default_version,
        )
        for region in self._tables.regions():
            published = self._tables.get(region)
            route = next((m for m in published.snapshot.models if m.model == record.model), None) if published \
                else None
            if route is None:
                continue
            view.default_version = route.default_version
            versions = [r.version for r in route.replicas]
            weights = [(w.version, w.weight) for w in route.version_weights]
            view.regions.append(admin_pb2.RolloutRegion(
                region=region, stable_ready=versions.count(record.stable), canary_ready=versions.count(record.canary),
                canary_share=rollout.canary_share(weights, route.default_version, set(versions), record.canary),
            ))
        return view
