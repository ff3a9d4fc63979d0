"""A replica reached over OpenAI HTTP only (no KServe address) is never chosen by the relay, which speaks KServe v2."""

from __future__ import annotations

import pytest

from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, route, snapshot

pytestmark = pytest.mark.timeout(20)


async def test_the_relay_leaves_http_only_replicas_out(rig) -> None:
    r = await rig({"r1": Behaviour()})
    http_only = route("h1", node="n2")
    http_only.address, http_only.http_address = "", "127.0.0.1:9"
    r.cp.push(snapshot(2, [route(r.replicas["r1"]), http_only]))
    assert (await r.cp.next_ack()).applied
    for i in range(12):
        await r.stub.Infer(request(prompt=f"hello number {i}"), metadata=PAID)
    assert r.served() == {"r1": 12}
    assert r.proxy.metrics.value("proxy_retries_total", model="m", reason="no_kserve") == 0
