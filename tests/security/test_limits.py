"""Server limits: message size and streams per connection, each refused with a clear status."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ferry import grpcutil
from ferry.config import Limits
from tests.dataplane.fakes import Behaviour
from tests.security.test_tenants import Rig, md, request


def test_every_server_bounds_streams_per_connection_and_message_size() -> None:
    options = dict(grpcutil.server_options(1024, 7))
    assert options["grpc.max_concurrent_streams"] == 7
    assert options["grpc.max_receive_message_length"] == 1024


SIZES = [("under", 10_000, grpc.StatusCode.OK), ("over", 70_000, grpc.StatusCode.RESOURCE_EXHAUSTED)]


@pytest.mark.parametrize(("size", "expected"), [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
async def test_a_message_over_the_size_limit_is_refused(size: int, expected: grpc.StatusCode) -> None:
    limits = Limits(max_message_bytes=64 * 1024, max_prompt_bytes=1 << 20)
    async with Rig(limits, Behaviour()) as rig:
        try:
            await rig.stub.Infer(request(prompt="x" * size), metadata=md("acme"), timeout=5)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        assert code == expected


async def test_streams_beyond_the_per_connection_limit_wait_for_a_free_one() -> None:
    """HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: the third call on one connection starts only when one ends."""
    limits = Limits(max_streams_per_connection=2)
    async with Rig(limits, Behaviour(delay=0.3)) as rig:
        calls = [asyncio.ensure_future(rig.stub.Infer(request(), metadata=md("acme"), timeout=5)) for _ in range(3)]
        most = 0
        while not all(c.done() for c in calls):  # sample the proxy's count at every turn of the loop
            most = max(most, rig.proxy.router._tenants.count("acme"))
            await asyncio.wait(calls, timeout=0.002)
        assert most == 2  # two at once, never three on this connection
        assert all(c.result().completion_tokens > 0 for c in calls)
