"""Memory returns after bursts of oversize requests: the proxy's bounded collect-and-trim (dataplane.memory)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from dataplane.memory import MIB, MemoryTrim, glibc_trim, rss_bytes
from ferry.v1 import inference_pb2_grpc
from tests.dataplane.conftest import PAID, Rig, request
from tests.dataplane.fakes import Behaviour

pytestmark = pytest.mark.timeout(30)


async def test_it_trims_only_after_growth_and_from_the_new_baseline() -> None:
    sizes = iter([100 * MIB, 120 * MIB, 140 * MIB, 90 * MIB, 90 * MIB, 110 * MIB, 130 * MIB, 95 * MIB])
    trims: list[int] = []
    memory = MemoryTrim(32 * MIB, rss=lambda: next(sizes), trim=lambda: trims.append(1) or 1)
    assert memory.enabled and memory.baseline == 100 * MIB
    assert not await memory.check()  # 120: +20, under the growth
    assert await memory.check() and memory.baseline == 90 * MIB  # 140: +40, trimmed, 90 after
    assert not await memory.check()  # 90
    assert not await memory.check()  # 110: +20 over the new baseline
    assert await memory.check() and memory.baseline == 95 * MIB  # 130: +40
    assert len(trims) == memory.trims == 2
    assert not MemoryTrim(0, rss=lambda: MIB, trim=lambda: 0).enabled  # 0: off


@pytest.mark.skipif(glibc_trim() is None or rss_bytes() is None, reason="needs glibc's malloc_trim and /proc")
async def test_rss_comes_back_after_a_burst_of_oversize_prompts(rig: Any) -> None:
    r: Rig = await rig({"r1": Behaviour()})
    assert r.proxy is not None
    prompt = "x" * (6 * MIB)  # over max_prompt_bytes (4 MiB), under the message limit (8 MiB): read, then refused
    async with grpc.aio.insecure_channel(f"127.0.0.1:{r.proxy.port}",
                                         options=[("grpc.max_send_message_length", 16 * MIB)]) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        await stub.Infer(request(), metadata=PAID, timeout=5)
        await r.proxy.memory.check()  # start from a trimmed baseline
        before = rss_bytes()
        assert before is not None

        async def oversize() -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Infer(request(prompt=prompt), metadata=PAID, timeout=10)
            return refused.value.code()

        for _ in range(3):
            codes = await asyncio.gather(*(oversize() for _ in range(8)))
            assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
        peak = rss_bytes()
        assert peak is not None
        await r.proxy.memory.check()  # what its task does within a second
        after = rss_bytes()
        assert after is not None
        assert after - before < 48 * MIB, (before / MIB, peak / MIB, after / MIB)
