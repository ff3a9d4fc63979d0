"""StreamWriter: a client stream's write never outlives the call.

The hang it guards against (a write left pending after the call's status arrived) shows only under load
(1 to 10 of the 250 to 300 streams refused in a run of 625 agents against busy control planes), so the race
itself is tested with a call whose write never completes, and the wiring with a real gRPC server that ends
the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from ferry.grpcutil import StreamWriter, start_server
from ferry.v1 import fleet_pb2, fleet_pb2_grpc


class HangingCall:
    """A call whose writes stay pending (``hang``) or complete; ``finish()`` ends it as gRPC does."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.written: list[Any] = []
        self.cancelled_writes = 0
        self._done = False
        self._callbacks: list[Callable[[Any], None]] = []

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def done(self) -> bool:
        return self._done

    def finish(self) -> None:
        self._done = True
        for callback in self._callbacks:
            callback(self)

    async def write(self, message: Any) -> None:
        if not self.hang:
            self.written.append(message)
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled_writes += 1
            raise


async def test_a_write_pending_when_the_call_ends_is_abandoned() -> None:
    call = HangingCall(hang=True)
    writer = StreamWriter(call)
    pending = asyncio.create_task(writer.write("telemetry"))
    await asyncio.sleep(0.01)
    assert not pending.done()
    call.finish()
    assert await asyncio.wait_for(pending, 1.0) is False
    assert writer.abandoned == 1 and call.cancelled_writes == 1
    assert await writer.write("after the end") is False  # nothing more is tried
    assert call.cancelled_writes == 1


async def test_a_write_gives_way_to_until() -> None:
    call = HangingCall(hang=True)
    reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    writer = StreamWriter(call, reader)
    pending = asyncio.create_task(writer.write("telemetry"))
    await asyncio.sleep(0.01)
    reader.set_exception(RuntimeError("the stream ended"))
    assert await asyncio.wait_for(pending, 1.0) is False
    assert call.cancelled_writes == 1
    reader.exception()


async def test_writes_that_complete_return_true() -> None:
    call = HangingCall(hang=False)
    writer = StreamWriter(call)
    assert await writer.write("a") is True
    assert await writer.write("b") is True
    assert call.written == ["a", "b"] and writer.abandoned == 0


async def test_cancelling_the_writer_cancels_the_write() -> None:
    call = HangingCall(hang=True)
    writer = StreamWriter(call)
    pending = asyncio.create_task(writer.write("telemetry"))
    await asyncio.sleep(0.01)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert call.cancelled_writes == 1


class EndsAfterFirst(fleet_pb2_grpc.FleetServicer):
    """Reads one message, then ends the stream UNAVAILABLE without reading more (as a refused registration)."""

    async def Connect(self, request_iterator: Any, context: Any) -> None:
        await anext(request_iterator.__aiter__())
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the store did not answer")


async def test_real_stream_ended_by_the_server() -> None:
    server, port = await start_server([(fleet_pb2_grpc.add_FleetServicer_to_server, EndsAfterFirst(),
                                        "ferry.v1.Fleet")], "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = fleet_pb2_grpc.FleetStub(channel).Connect()
            writer = StreamWriter(call)
            assert await writer.write(fleet_pb2.AgentMessage(register=fleet_pb2.Register(node="n1"))) is True
            assert await asyncio.wait_for(call.code(), 5.0) == grpc.StatusCode.UNAVAILABLE
            # The call has ended: a write is refused at once, never left pending.
            assert await asyncio.wait_for(writer.write(fleet_pb2.AgentMessage(
                telemetry=fleet_pb2.Telemetry(seq=1))), 1.0) is False
    finally:
        await server.stop(None)
