"""``Admin.Rollout`` and ``Admin.ListRollouts``: a mixin of :class:`controlplane.servicers.AdminServicer`.

The store edge of :mod:`controlplane.rollout` (which holds the policy):

- ``Rollout``: validates (INVALID_ARGUMENT naming ``model``, ``version``,
  ``canary_percent`` or ``action``; NOT_FOUND for a model outside the catalog,
  or a promote / roll back with no rollout), then reads the record and writes
  the next one with ``put_if`` on the revision it read (three tries, then
  UNAVAILABLE), so two operators never lose one another's change. Refused with
  UNAVAILABLE while the store is unreachable, before anything is written, as a
  drain is. It returns once the store echoed the write to this control plane's
  intent cache and, leading, the tables were recomputed and offered to the
  proxies (a follower's leader does so within a debounce); the answer shows,
  per region, the replicas of each version routable and the canary's share.
- ``ListRollouts``: every rollout record (optionally one model's), sorted by
  model, each with the same per-region view of the tables served here.

Cost: O(regions x models) per answer, besides the store calls.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from controlplane import rollout, validate
from controlplane.store import rollout_key
from controlplane.table import catalog_models
from ferry.errors import InvalidArgument, NotFound, Unavailable
from ferry.grpcutil import answer
from ferry.v1 import admin_pb2

if TYPE_CHECKING:
    from controlplane.controller import Controller

log = logging.getLogger(__name__)

TRIES = 3
ACTIONS = {
    admin_pb2.RolloutRequest.ACTION_CANARY: rollout.Action.CANARY,
    admin_pb2.RolloutRequest.ACTION_PROMOTE: rollout.Action.PROMOTE,
    admin_pb2.RolloutRequest.ACTION_ROLLBACK: rollout.Action.ROLLBACK,
}



def rollout_view(c: Controller, record: rollout.Rollout) -> admin_pb2.RolloutView:
    """The record with, per region, the routable replicas of both versions and the canary's share now."""
    view = admin_pb2.RolloutView(
        model=record.model, stable_version=record.stable, canary_version=record.canary,
        canary_percent=round(record.weight * 100.0, 6), state=record.state, updated_at=record.updated_at,
        default_version=record.default_version,
    )
    for region in c.tables.regions():
        published = c.tables.get(region)
        route = next((m for m in published.snapshot.models if m.model == record.model), None) if published else None
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


class RolloutRpcs:
    """``Admin.Rollout`` and ``Admin.ListRollouts``."""

    _c: Controller

    async def Rollout(self, request: admin_pb2.RolloutRequest, context: Any) -> admin_pb2.RolloutResponse:
        async def call() -> admin_pb2.RolloutResponse:
            return admin_pb2.RolloutResponse(rollout=await self._rollout(request))
        return await answer(context, call)

    async def ListRollouts(
        self, request: admin_pb2.ListRolloutsRequest, context: Any,
    ) -> admin_pb2.ListRolloutsResponse:
        async def call() -> admin_pb2.ListRolloutsResponse:
            c = self._c
            validate.check_filter(request.model, "model", c.settings.max_name_bytes)
            records = [r for m, r in sorted(c.intent.rollouts.items()) if not request.model or m == request.model]
            return admin_pb2.ListRolloutsResponse(rollouts=[rollout_view(c, r) for r in records])
        return await answer(context, call)

    async def _rollout(self, request: admin_pb2.RolloutRequest) -> admin_pb2.RolloutView:
        c, s = self._c, self._c.settings
        action = ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgument("action", "required: canary, promote or rollback")
        validate.check_name(request.model, "model", s.max_name_bytes)
        validate.check_filter(request.version, "version", s.max_version_bytes)
        if action is rollout.Action.CANARY:
            rollout.check_percent(request.canary_percent)
        model = next((m for m in catalog_models(c._catalog, c.members()) if m.name == request.model), None)
        if model is None:
            raise NotFound("model", request.model)
        what = f"rollout of {request.model}"
        c._check_store(what)
        key = rollout_key(request.model)
        try:
            for _ in range(TRIES):
                kv = await c.store.get(key)
                current: rollout.Rollout | None = None
                if kv is not None:
                    try:
                        current = rollout.Rollout.decode(request.model, kv.value)
                    except ValueError as exc:
                        log.warning("%s; replaced by this rollout", exc)
                record = rollout.transition(
                    current, model=request.model, action=action, version=request.version,
                    percent=request.canary_percent, catalog_default=model.default_version, now=c._wall(),
                    max_name_bytes=s.max_name_bytes, max_version_bytes=s.max_version_bytes,
                )
                if record == current and kv is not None:
                    revision = kv.revision  # nothing to write: promote or roll back again
                    break
                revision = await c.store.put_if(key, record.encode(), revision=kv.revision if kv is not None else 0)
                if revision:
                    break
            else:
                raise Unavailable(f"{what}: the record changed under {TRIES} tries; try again")
            await c.intent.wait(revision, s.store_timeout_seconds)
        except Unavailable as exc:
            raise Unavailable(c._refusal(what, str(exc))) from exc
        if c.leading:
            c.recompute()
        log.info("rollout of %s: %s, stable %s, canary %s at %g %%", record.model, record.state, record.stable,
                 record.canary, record.weight * 100)
        return rollout_view(c, record)
