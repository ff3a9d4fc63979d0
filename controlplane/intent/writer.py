"""Every operator write of intent, one way: check the store, write conditionally, wait for the echo and the tables.

:class:`IntentWriter` is what drains, cordons, tenants, rollouts and
allocations write through. A write (:meth:`IntentWriter.write`):

1. is refused with ``Unavailable`` (naming the store and why) while the
   store is unreachable: at once when its last calls failed
   (:meth:`IntentWriter.check`), else after a read that gets no answer, before
   anything is written. Intent lives in the store, so a control plane that
   cannot write it must not pretend;
2. reads the key and writes what ``edit`` makes of it with ``put_if`` on the
   revision it read (at most ``TRIES`` times, then ``Unavailable``), so two
   operators never lose one another's change; ``edit`` may also delete the key
   or keep it as it is, and raise a :class:`ferry.errors.FerryError` to refuse;
   a write that times out may still land later, and the answer says so;
3. waits (at most ``store_timeout_seconds``) for the store to echo it to this
   control plane's :class:`controlplane.intent.cache.IntentCache`;
4. waits (at most ``store_timeout_seconds``, then returns) until the leader's
   tables, as held here, satisfy ``reflected``, through the ``reflect``
   callable it was given (:meth:`controlplane.services.tables.TableService.reflect`
   in the controller): recomputed at once on the leader, relayed by the leader
   to a follower. The same on both.

:meth:`IntentWriter.change` is steps 1-3 alone and :meth:`IntentWriter.settle`
step 4, for a caller with more than one key to write (a tenant and the marker
of the managed set). State: none but the store it writes to (``store``,
replaceable). Dependencies: the store, the intent cache, ``reflect`` (the
wait for the tables, injected: the writer sits below the tables), the timeout.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.intent.cache import IntentCache
from controlplane.store.base import KeyValue, Store
from ferry.errors import Unavailable

TRIES = 3


class Keep(enum.Enum):
    """An edit that leaves the key as it is (nothing to write)."""

    KEEP = "keep"


KEEP = Keep.KEEP
Edit = bytes | None | Keep  # bytes: put this value; None: delete the key; KEEP: write nothing
Reflect = Callable[[Callable[[], bool], float], Awaitable[bool]]  # (predicate, seconds) -> True once it holds


@dataclass(frozen=True, slots=True)
class Written:
    """What a write found (``before``: the key as read, None when absent) and the revision it waited for."""

    before: KeyValue | None
    revision: int


class IntentWriter:
    """Writes operator intent to the store and waits for the leader's tables to reflect it.

    State: the store written to. Dependencies: the intent cache (the echo), ``reflect`` (the wait for
    the tables), the timeout.
    """

    def __init__(self, store: Store, intent: IntentCache, reflect: Reflect, *, timeout: float) -> None:
        self.store = store
        self._intent = intent
        self._reflect = reflect
        self._timeout = timeout

    def check(self, what: str) -> None:
        """Refuse ``what`` with ``Unavailable`` when the store's last calls failed."""
        health = self.store.health()
        if not health.ok:
            raise Unavailable(self.refusal(what, health.error))

    def refusal(self, what: str, detail: str) -> str:
        """The message refusing ``what`` because the store is unreachable (``detail``: why)."""
        health = self.store.health()
        where = f"{health.backend} at {health.endpoint}" if health.endpoint else health.backend
        return (f"{what} refused: the store ({where}) is unreachable, so intent changes are refused until it "
                f"returns; routing continues on the last tables ({detail})")

    async def write(
        self, what: str, key: str, edit: Callable[[KeyValue | None], Edit], *, reflected: Callable[[], bool],
    ) -> Written:
        """Steps 1-4 of the module docstring for one key; returns what was read and the revision."""
        written = await self.change(what, key, edit)
        await self.settle(reflected)
        return written

    async def change(self, what: str, key: str, edit: Callable[[KeyValue | None], Edit]) -> Written:
        """Check, read, write conditionally (bounded retries), wait for the store's echo."""
        self.check(what)
        for _ in range(TRIES):
            try:  # a read first: a store that does not answer refuses before anything is sent
                kv = await self.store.get(key)
            except Unavailable as exc:
                raise Unavailable(self.refusal(what, str(exc))) from exc
            value = edit(kv)
            try:
                if value is KEEP:
                    revision = kv.revision if kv is not None else 0
                    break
                if value is None:
                    revision = await self.store.delete(key) if kv is not None else 0
                    break
                revision = await self.store.put_if(key, value, revision=kv.revision if kv is not None else 0)
            except Unavailable as exc:
                raise Unavailable(f"{what}: the store did not confirm the write ({exc}); it may still apply when "
                                  "the store answers again") from exc
            if revision:
                break
        else:
            raise Unavailable(self.refusal(what, f"the record changed under {TRIES} tries; try again"))
        await self.echo(what, revision)
        return Written(kv, revision)

    async def echo(self, what: str, revision: int) -> None:
        """Wait until this control plane's intent cache shows store ``revision`` (0: nothing to wait for)."""
        if not revision:
            return
        try:
            await self._intent.wait(revision, self._timeout)
        except Unavailable as exc:
            raise Unavailable(self.refusal(what, str(exc))) from exc

    async def settle(self, reflected: Callable[[], bool]) -> bool:
        """Wait (bounded) until the leader's tables, as held here, satisfy ``reflected``; False on timeout."""
        return await self._reflect(reflected, self._timeout)
