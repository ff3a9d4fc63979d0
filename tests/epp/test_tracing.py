"""The endpoint picker's traces: the caller's ``traceparent`` read from Envoy's headers, the replica's set by the
header mutation (the picker's ``forward`` span as parent), and the tree exported once Envoy reports the end."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane.tracing import parse_traceparent
from tests.dataplane.otlp import Collector, attributes
from tests.dataplane.test_tracing import PARENT_ID, TRACE_ID, TRACEPARENT, TRACESTATE, tree
from tests.epp import test_protocol
from tests.epp.test_protocol import UPSTREAM_END, completion, entry, finish, idle, report, routed

picker = test_protocol.picker  # the fixture: an in-process picker on a fake control plane

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def collector() -> Any:
    c = await Collector().start()
    yield c
    await c.stop()


async def test_the_picker_traces_under_the_callers_context_and_hands_the_replica_its_span(picker, collector) -> None:
    p = await picker(trace_endpoint=collector.address, trace_insecure=True, trace_flush_seconds=0.05)
    request = await routed(p, completion(), ("traceparent", TRACEPARENT), ("tracestate", TRACESTATE))
    await finish(p, request)
    await idle(p)
    root, children = tree(await collector.trace(bytes.fromhex(TRACE_ID)))
    assert root.name == "pick" and root.parent_span_id.hex() == PARENT_ID
    assert attributes(root)["ferry.status"] == "OK" and attributes(root)["ferry.request_id"] == request.request_id
    assert {"decision", "forward"} <= set(children) <= {"admission", "decision", "forward"}
    chosen = attributes(children["decision"][0])
    (forward,) = children["forward"]
    assert attributes(forward)["ferry.replica"] == chosen["ferry.replica"]
    assert attributes(forward)["ferry.outcome"] == "ok" and attributes(forward)["ferry.fallbacks"].count(",") == 1
    sent = parse_traceparent(request.headers["traceparent"])  # what Envoy forwards to the replica
    assert sent is not None and sent[0] == int(TRACE_ID, 16) and sent[1] == int.from_bytes(forward.span_id, "big")
    assert request.headers["tracestate"] == TRACESTATE
    assert collector.services() == {"ferry-picker"}


async def test_a_fallback_that_served_is_a_second_forward_span(picker, collector) -> None:
    p = await picker(trace_endpoint=collector.address, trace_insecure=True, trace_flush_seconds=0.05)
    request = await routed(p, completion(), ("traceparent", TRACEPARENT))
    await request.call.done_writing()
    await report(p, entry(request.request_id, UPSTREAM_END, 0, request.endpoints[0]))  # never answered
    await report(p, entry(request.request_id, UPSTREAM_END, 200, request.endpoints[1]))
    await idle(p)
    root, children = tree(await collector.trace(bytes.fromhex(TRACE_ID)))
    assert [attributes(f)["ferry.outcome"] for f in children["forward"]] == ["unreached", "ok"]
    assert attributes(root)["ferry.attempts"] == 2


async def test_without_tracing_the_picker_sets_no_traceparent(picker) -> None:
    p = await picker()
    request = await routed(p, completion(), ("traceparent", TRACEPARENT))
    assert "traceparent" not in request.headers  # Envoy forwards the caller's own, untouched
    await finish(p, request)
    await idle(p)
