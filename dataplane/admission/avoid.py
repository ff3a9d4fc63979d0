"""Where the tier queues' requests should not go: replicas kept for interactive, shards, replicas this proxy filled.

:class:`Placement` (one per model, owned by :class:`dataplane.admission.queues.TierQueues`)
answers :meth:`Placement.avoid` for the pick, which treats it as a soft
filter (:func:`dataplane.pick.decide.decide`'s ``avoid``: ignored when nothing would
be left). Pure: ``now`` and the proxy's in-flight counts are passed in.

- **Replicas kept for interactive** (``interactive_share``, 0: none). The
  floor of ``interactive_share`` x the model's replicas (those with slots;
  at least one is left to the others), chosen by rendezvous order (the same
  replicas at every proxy, and only a departing kept replica changes the
  set), run no batch or standard work: those tiers are kept off them, and
  the tier queues dispatch them only into the other replicas' slots
  (:meth:`Placement.idle_kept_slots`: the kept slots less
  :attr:`Placement.on_kept`, the requests placed on kept replicas).
  Interactive requests may go anywhere. On
  a continuous-batching engine a request's steps grow with everything the
  replica runs, so this buys interactive latency with utilisation: the
  kept replicas run only interactive work even when it is light.
- **Shards** (:mod:`dataplane.admission.sharding`). Each dispatch round reports, per
  tier, the tenants left at their fair-share ceiling with work waiting and
  their ceilings (:meth:`Placement.note_heavy`). A tenant stays heavy
  ``hold_seconds`` after it was last reported; :meth:`Placement.replan`
  plans the shards again (:func:`dataplane.admission.sharding.plan`, at most
  ``max_share`` of the replicas) when the heavy tenants or the replicas
  changed. A heavy tenant is kept off everything outside its shard, every
  other tenant off the shards. Shards are cut from the replicas not kept for
  interactive.
- **Crowded replicas** (:meth:`Placement.crowded`). The queues dispatch
  while the model has room, but the pick may still choose a replica this
  proxy has filled (a prefix's home, under a load bound from telemetry up to
  a push old): sent there, a request waits on the replica for another to
  finish. An interactive request sent to a replica full of preemptible batch
  or standard work makes room at once (:meth:`dataplane.admission.queues.TierQueues.make_room`),
  so for it, once every replica it may use is full, only what is left after
  those victims counts. While one of them has room, it goes there and
  nothing is preempted: a global preemption (:meth:`dataplane.admission.queues.TierQueues.preemptions`)
  has just freed a slot on one replica, and a pick that chose another full
  one would preempt a second request for the same arrival. Victims are
  counted per replica as the queues place and release tickets
  (:meth:`Placement.place`, :meth:`Placement.forget`).

Parameters: ``max_share`` (``[proxy] tenant_shard_max_share``, 0.5; 0: no
shards), ``hold_seconds`` (``tenant_shard_hold_seconds``, 1 s),
``interactive_share`` (``interactive_replica_share``, 0: off).

Cost: :meth:`Placement.avoid` O(replicas with requests of this proxy in flight), for an
interactive request O(replicas) at worst (finding one with room stops at the first);
:meth:`Placement.replan` O(heavy tenants) unless it plans again;
:meth:`Placement.place` and :meth:`Placement.forget` O(1).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

from dataplane.admission.sharding import MAX_SHARE, NONE, Shards, plan, rendezvous

KEPT_KEY = "interactive"  # the rendezvous key of the replicas kept for interactive


class Placement:
    """The avoid sets of one model's requests; see the module docstring."""

    def __init__(self, max_share: float = MAX_SHARE, hold_seconds: float = 1.0,
                 interactive_share: float = 0.0) -> None:
        self.max_share = max_share
        self.hold_seconds = hold_seconds
        self.interactive_share = interactive_share
        self.replicas: Mapping[str, int] = {}  # replica id -> concurrency target
        self.kept: frozenset[str] = frozenset()  # replicas kept for interactive
        self.kept_slots = 0
        self.total_slots = 0
        self._shared: Mapping[str, int] = {}  # the replicas not kept: where shards are cut
        self._lower: dict[frozenset[str], frozenset[str]] = {}  # a keep-off set -> it and the kept replicas
        self.shards: Shards = NONE
        self._version = 0
        self._heavy: dict[str, dict[str, int]] = {}  # tier -> tenant -> its ceiling there
        self._seen: dict[str, tuple[int, float]] = {}  # heavy tenant -> (slots, last seen heavy)
        self._plan_key: tuple[object, ...] = ()
        self._victims: dict[str, int] = {}  # replica -> preemptible lower-tier requests running there
        self._counted: dict[Hashable, str] = {}  # victim -> its replica
        self._placed: dict[Hashable, str] = {}  # every request placed and not forgotten -> its replica
        self.on_kept = 0  # of those, on a replica kept for interactive

    def set_replicas(self, replicas: Mapping[str, int]) -> None:
        """The model's replicas (id -> concurrency target)."""
        if replicas != self.replicas:
            self.replicas = dict(replicas)
            self._version += 1
            self.kept = kept_for_interactive(self.replicas, self.interactive_share)
            self.kept_slots = sum(max(self.replicas[r], 0) for r in self.kept)
            self.total_slots = sum(max(n, 0) for n in self.replicas.values())
            self._shared = {r: n for r, n in self.replicas.items() if r not in self.kept}
            self._lower = {}
            self.on_kept = sum(1 for r in self._placed.values() if r in self.kept)

    def idle_kept_slots(self, capacity: int) -> int:
        """Of ``capacity`` (this proxy's share of the slots), those on kept replicas no request placed here fills."""
        if not self.kept_slots:
            return 0
        kept = min(capacity, math.ceil(capacity * self.kept_slots / self.total_slots - 1e-9))
        return kept - min(self.on_kept, kept)

    def note_heavy(self, tier: str, heavy: Mapping[str, int]) -> None:
        """The tenants of ``tier`` at their ceiling with work waiting (tenant -> ceiling); empty: none."""
        self._heavy[tier] = dict(heavy)

    def replan(self, now: float) -> None:
        """Plan the shards again when the heavy tenants (held ``hold_seconds``) or the replicas changed."""
        if self.max_share <= 0 or not self.replicas:
            if self.shards is not NONE:
                self.shards, self._lower = NONE, {}
            self._seen = {}
            return
        current: dict[str, int] = {}
        for heavy in self._heavy.values():
            for tenant, slots in heavy.items():
                current[tenant] = current.get(tenant, 0) + slots
        for tenant, slots in current.items():
            self._seen[tenant] = (slots, now)
        for tenant in [t for t, (_, at) in self._seen.items() if now - at > self.hold_seconds]:
            del self._seen[tenant]
        heavy = {t: n for t, (n, _) in self._seen.items()}
        key = (tuple(sorted(heavy.items())), self._version)
        if key != self._plan_key:
            self._plan_key = key
            self.shards, self._lower = plan(heavy, self._shared, self.max_share), {}

    def place(self, key: Hashable, replica: str, *, victim: bool) -> None:
        """``key`` was sent to ``replica``; ``victim``: a running request an interactive one may preempt."""
        self.forget(key)
        self._placed[key] = replica
        if replica in self.kept:
            self.on_kept += 1
        if victim and replica:
            self._counted[key] = replica
            self._victims[replica] = self._victims.get(replica, 0) + 1

    def forget(self, key: Hashable) -> None:
        """``key`` no longer counts where it was placed (preempting, requeued or finished)."""
        if self._placed.pop(key, None) in self.kept:
            self.on_kept -= 1
        replica = self._counted.pop(key, None)
        if replica is not None:
            left = self._victims[replica] - 1
            if left > 0:
                self._victims[replica] = left
            else:
                del self._victims[replica]

    def crowded(self, inflight: Mapping[str, int], *, preempt: bool = False,
                off: frozenset[str] = frozenset()) -> frozenset[str]:
        """Replicas full by ``inflight`` (this proxy's count).

        With ``preempt`` (an interactive request), when every replica outside
        ``off`` is full: those full beyond the victims there.
        """
        slots = self.replicas
        full = frozenset(r for r, n in inflight.items() if n >= slots.get(r, 0) > 0)
        if not preempt or any(n > 0 and r not in full and r not in off for r, n in slots.items()):
            return full  # room somewhere it may go: nothing to preempt
        victims = self._victims
        return frozenset(r for r in full if inflight[r] - victims.get(r, 0) >= slots[r])

    def avoid(self, tenant: str, inflight: Mapping[str, int], *, interactive: bool) -> frozenset[str]:
        """Replicas a request of ``tenant`` should not go to.

        Those kept for interactive (a lower tier's request), its shard's
        complement or the shards, and crowded ones.
        """
        off = self.shards.keep_off(tenant)
        if not interactive and self.kept:
            lower = self._lower.get(off)
            if lower is None:  # one per keep-off set of the current shards: O(1) per request after the first
                lower = self._lower[off] = off | self.kept
            off = lower
        crowded = self.crowded(inflight, preempt=interactive, off=off)
        return off | crowded if off else crowded


def kept_for_interactive(replicas: Mapping[str, int], share: float) -> frozenset[str]:
    """The first floor(``share`` x n) of the n replicas with slots in rendezvous order, leaving at least one."""
    ids = sorted(r for r, n in replicas.items() if n > 0)
    count = min(math.floor(share * len(ids) + 1e-9), len(ids) - 1)
    return frozenset(rendezvous(KEPT_KEY, ids)[:count]) if count > 0 else frozenset()
