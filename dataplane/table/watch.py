"""The ``Tables.Watch`` client: follow the region's table, ACK or NACK each snapshot or delta.

:class:`TableWatcher` keeps one stream to one control plane at a time. It
subscribes with (proxy_id, region, have_version = the version it holds, 0
when none, ``deltas``), applies each snapshot or delta through
:class:`dataplane.table.local.TableHolder` and answers ``Ack(version, nonce,
applied=true)``, or ``applied=false`` with the rejection's reason (the holder
keeps its last good table), and ``resync`` when a delta did not fit the table
held (a gap: the control plane then sends the table in full). When the
stream breaks or cannot be opened it moves to the next address of the list
and waits per :class:`ferry.backoff.Backoff` (equal jitter over an exponential
ceiling, default 0.1 s doubling to 5 s), reset once a snapshot arrives. Meanwhile
the proxy keeps serving on its last table; a warning is logged once per
outage when the table is older than ``table_stale_warn_seconds``.

With ``router`` given, each applied table is handed to it
(:meth:`dataplane.routerconfig.RouterConfigs.follow`) and the ack carries
the router config version the proxy runs, or the one it refused and why.

With ``usage`` given, a task beside the reader sends the proxy's usage report
(:mod:`dataplane.usage`) on the same stream every ``usage_seconds``; writes
are serialised by a lock.

Cost: one stream and one Ack per snapshot or delta; applying a delta is a
copy of the snapshot held plus O(what it names) (:mod:`ferry.tabledelta`), the
table build O(replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import grpc

from dataplane.metrics import ProxyMetrics
from dataplane.table.local import TableHolder, TableRejected
from ferry.backoff import Backoff
from ferry.grpcutil import StreamWriter, channel_options
from ferry.logs import event
from ferry.tls import TLSConfig
from ferry.tls import channel as tls_channel
from ferry.v1 import tables_pb2, tables_pb2_grpc

log = logging.getLogger("ferry.proxy.watch")


class TableWatcher:
    """Follows the table of ``region`` from the control planes at ``addresses``."""

    def __init__(
        self,
        addresses: Sequence[str],
        holder: TableHolder,
        *,
        proxy_id: str,
        region: str,
        backoff: Backoff,
        metrics: ProxyMetrics,
        stale_warn_seconds: float = 10.0,
        clock: Callable[[], float],
        tls: TLSConfig | None = None,
        usage: Callable[[], tables_pb2.Report] | None = None,
        usage_seconds: float = 1.0,
        router: Callable[[tables_pb2.TableSnapshot], tuple[int, int, str]] | None = None,
    ) -> None:
        self._router = router  # dataplane.routerconfig: the router config the table assigns, run and acked
        self._tls = tls  # mutual TLS to the control planes (None: plain text)
        self._usage = usage if usage_seconds > 0 else None  # dataplane.usage: a report every usage_seconds
        self._usage_seconds = usage_seconds
        if not addresses:
            raise ValueError("at least one control-plane address is needed")
        self._addresses = list(addresses)
        self._holder = holder
        self._proxy_id = proxy_id
        self._region = region
        self._backoff = backoff
        self._metrics = metrics
        self._stale_warn = stale_warn_seconds
        self._clock = clock
        self._next_index = 0
        self.connected = asyncio.Event()  # set while a stream is open and has delivered a snapshot

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop`` is set, reconnecting across the addresses."""
        warned = False
        while not stop.is_set():
            address = self._addresses[self._next_index % len(self._addresses)]
            self._next_index += 1
            got = False
            try:
                got = await self._watch(address, stop)
            except grpc.aio.AioRpcError as exc:
                event(log, "table_watch_ended", control_plane=address, status=exc.code().name)
            except Exception as exc:  # the loop outlives any stream problem
                event(log, "table_watch_ended", control_plane=address, status=type(exc).__name__)
            finally:
                got = got or self.connected.is_set()
                self.connected.clear()
            if stop.is_set():
                return
            if got:
                warned = False
            if not warned and self._holder.age() > self._stale_warn:
                event(log, "table_stale", logging.WARNING, age_seconds=round(self._holder.age(), 3),
                      version=self._holder.version, detail="serving the last table until a control plane answers")
                warned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._backoff.next_delay())

    async def _watch(self, address: str, stop: asyncio.Event) -> bool:
        """One stream; returns whether any snapshot arrived on it."""
        got = False
        async with tls_channel(address, self._tls, options=channel_options()) as channel:
            call = tables_pb2_grpc.TablesStub(channel).Watch()
            stopper = asyncio.ensure_future(stop.wait())
            reporter: asyncio.Future[None] | None = None
            try:
                subscribe = tables_pb2.Subscribe(
                    proxy_id=self._proxy_id, region=self._region, have_version=self._holder.version, deltas=True
                )
                writer = StreamWriter(call, stopper)  # a write the call's end abandons: the next read says why
                await writer.write(tables_pb2.WatchRequest(subscribe=subscribe))
                lock = asyncio.Lock()  # one write at a time: acks here, usage reports from the reporter
                if self._usage is not None:
                    reporter = asyncio.ensure_future(self._report(writer, lock))
                while True:
                    reader = asyncio.ensure_future(call.read())
                    done, _ = await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if reader not in done:
                        reader.cancel()
                        return got
                    snapshot = reader.result()
                    if snapshot is grpc.aio.EOF:
                        return got
                    got = True
                    self._backoff.reset()
                    self.connected.set()
                    async with lock:
                        await writer.write(tables_pb2.WatchRequest(ack=self._apply(snapshot)))
            finally:
                stopper.cancel()
                if reporter is not None:
                    reporter.cancel()
                call.cancel()

    async def _report(self, writer: StreamWriter, lock: asyncio.Lock) -> None:
        """Send a usage report every ``usage_seconds`` until the stream ends (its reader sees why)."""
        assert self._usage is not None
        try:
            while True:
                await asyncio.sleep(self._usage_seconds)
                report = self._usage()
                async with lock:
                    if not await writer.write(tables_pb2.WatchRequest(report=report)):
                        return
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            return  # the stream ended
        except Exception:  # a bug: no more reports on this stream; the table keeps flowing
            log.exception("usage report failed")

    def _apply(self, snapshot: tables_pb2.TableSnapshot) -> tables_pb2.Ack:
        try:
            table = self._holder.apply(snapshot)
        except TableRejected as rejected:
            self._metrics.table_rejections.inc()
            event(log, "table_rejected", logging.WARNING, version=snapshot.version, reason=rejected.reason,
                  resync=rejected.resync)
            return tables_pb2.Ack(version=snapshot.version, nonce=snapshot.nonce, applied=False,
                                  error=rejected.reason, resync=rejected.resync)
        self._metrics.table_version.set(table.version)
        ack = tables_pb2.Ack(version=table.version, nonce=table.nonce, applied=True)
        if self._router is not None and self._holder.snapshot is not None:
            ack.router_version, ack.router_refused, ack.router_error = self._router(self._holder.snapshot)
        return ack
