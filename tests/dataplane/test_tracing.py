"""Request traces (dataplane.tracing): W3C context in, the span tree out over OTLP to a receiver started here.

A proxy of the rig (fake control plane, fake KServe replicas: real gRPC servers)
exports to :class:`tests.dataplane.otlp.Collector`, a real OTLP/gRPC
``TraceService`` server. Each test sends one request with a known
``traceparent`` and reads back the span tree, and what the replica received.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from dataplane import tracing
from dataplane.config import ProxySettings
from dataplane.pick.p2c import Branch
from dataplane.tracing import Exporter, Tracer, TraceSettings, parse_traceparent
from ferry.errors import ConfigError
from tests.dataplane.conftest import KEYS, PAID, request
from tests.dataplane.fakes import Behaviour
from tests.dataplane.otlp import Collector, attributes

pytestmark = pytest.mark.timeout(30)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
TRACESTATE = "vendor=abc,other=1"
BRANCHES = {b.value for b in Branch}
SERVER, CLIENT = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_CLIENT


@pytest.fixture
async def collector() -> Any:
    c = await Collector().start()
    yield c
    await c.stop()


def traced(collector: Collector, **more: Any) -> dict[str, Any]:
    return {"trace_endpoint": collector.address, "trace_insecure": True, "trace_flush_seconds": 0.05, **more}


def tree(spans: list[trace_pb2.Span]) -> tuple[trace_pb2.Span, dict[str, list[trace_pb2.Span]]]:
    """The root and its children by name; every span is the root's child, and of one trace."""
    (root,) = [s for s in spans if s.kind == SERVER]
    children: dict[str, list[trace_pb2.Span]] = {}
    for span in spans:
        if span is not root:
            assert span.parent_span_id == root.span_id, span.name
            children.setdefault(span.name, []).append(span)
    for span in spans:
        assert span.trace_id == root.trace_id and span.end_time_unix_nano >= span.start_time_unix_nano > 0
    return root, children


def check_stream_trace(spans: list[trace_pb2.Span], replica_metadata: dict[str, str], *, name: str, tier: str) -> None:
    """The tree of one streamed request under the client's context, and the context the replica was given."""
    root, children = tree(spans)
    assert root.trace_id.hex() == TRACE_ID and root.parent_span_id.hex() == PARENT_ID  # the client's trace kept
    assert root.name == name and root.trace_state == TRACESTATE
    ended = attributes(root)
    assert ended["ferry.status"] == "OK" and ended["ferry.model"] == "m" and ended["ferry.tier"] == tier
    assert ended["ferry.completion_tokens"] == 3 and ended["ferry.attempts"] == 1
    assert ended["ferry.replica"] == "r1" and ended["ferry.region"] == "local"
    assert root.status.code != trace_pb2.Status.STATUS_CODE_ERROR
    assert set(children) == {"admission", "decision", "forward"}, sorted(children)
    (admission,) = children["admission"]
    assert attributes(admission)["ferry.tier"] == tier
    (decision,) = children["decision"]
    chosen = attributes(decision)
    assert chosen["ferry.branch"] in BRANCHES and chosen["ferry.replica"] == "r1"
    assert chosen["ferry.region"] == "local" and chosen["ferry.model"] == "m" and chosen["ferry.tier"] == tier
    assert chosen["ferry.version"] == "v1"
    (forward,) = children["forward"]
    assert forward.kind == CLIENT
    assert attributes(forward)["ferry.replica"] == "r1" and attributes(forward)["ferry.outcome"] == "ok"
    assert [e.name for e in forward.events] == ["first_token"]
    assert forward.start_time_unix_nano <= forward.events[0].time_unix_nano <= forward.end_time_unix_nano
    assert admission.end_time_unix_nano <= decision.start_time_unix_nano <= forward.start_time_unix_nano
    assert root.start_time_unix_nano <= admission.start_time_unix_nano
    assert forward.end_time_unix_nano <= root.end_time_unix_nano
    # the replica's parent is the forward span, in the client's trace
    sent = parse_traceparent(replica_metadata["traceparent"])
    assert sent is not None and sent[0] == int(TRACE_ID, 16) and sent[1] == int.from_bytes(forward.span_id, "big")
    assert replica_metadata["tracestate"] == TRACESTATE


async def test_a_streamed_grpc_request_exports_its_span_tree_under_the_clients_trace(rig, collector) -> None:
    r = await rig({"r1": Behaviour(chunks=3)}, settings=traced(collector))
    metadata = (*PAID, ("traceparent", TRACEPARENT), ("tracestate", TRACESTATE))
    chunks = [c async for c in r.stub.InferStream(request(), metadata=metadata)]
    assert chunks[-1].final and chunks[-1].summary.completion_tokens == 3
    spans = await collector.trace(bytes.fromhex(TRACE_ID))
    check_stream_trace(spans, r.replicas["r1"].metadata[0], name="ferry.v1.Inference/InferStream",
                       tier="interactive")
    assert collector.services() == {"ferry-proxy"}
    proxy, r.proxy = r.proxy, None
    await proxy.stop(0)  # the export's answer counted before it stops
    assert proxy.metrics.value("proxy_trace_spans_total", outcome="exported") == len(spans)


async def test_a_streamed_http_request_exports_the_same_tree(rig, collector) -> None:
    r = await rig({"r1": Behaviour(chunks=3)}, settings=traced(collector))
    port = await r.proxy.start_http("127.0.0.1:0")
    headers = {"Authorization": f"Bearer {KEYS['paid']}", "traceparent": TRACEPARENT, "tracestate": TRACESTATE,
               "x-ferry-tier": "interactive"}
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=headers,
                                                    json={"model": "m", "max_tokens": 8, "stream": True,
                                                          "messages": [{"role": "user", "content": "hi"}]}) as resp:
        assert resp.status == 200
        events = [line.decode().strip() async for line in resp.content if line.strip()]
    assert events[-1] == "data: [DONE]"
    spans = await collector.trace(bytes.fromhex(TRACE_ID))
    check_stream_trace(spans, r.replicas["r1"].metadata[0], name="POST /v1/chat/completions", tier="interactive")


async def test_a_unary_request_without_context_starts_a_trace_and_a_failure_is_an_error_span(rig, collector) -> None:
    r = await rig({"r1": Behaviour()}, settings=traced(collector))
    answer = await r.stub.Infer(request(), metadata=PAID)
    sent = parse_traceparent(r.replicas["r1"].metadata[0]["traceparent"])
    spans = await collector.trace()
    root, children = tree(spans)
    assert sent is not None and root.trace_id == sent[0].to_bytes(16, "big") and not root.parent_span_id
    assert attributes(root)["ferry.request_id"] == answer.request_id
    assert [e.name for e in children["forward"][0].events] == []  # a unary answer has no first token of its own
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await r.stub.Infer(request(model="nope"), metadata=(*PAID, ("traceparent", TRACEPARENT)))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    spans = await collector.trace(bytes.fromhex(TRACE_ID))
    root, children = tree(spans)
    assert not children and attributes(root)["ferry.status"] == "NOT_FOUND"
    assert root.status.code == trace_pb2.Status.STATUS_CODE_ERROR and root.status.message == "NOT_FOUND"


async def test_a_retried_request_has_one_forward_span_per_attempt(rig, collector) -> None:
    r = await rig({"r1": Behaviour(kind="fail"), "r2": Behaviour(kind="fail")}, settings=traced(collector))
    with pytest.raises(grpc.aio.AioRpcError):
        await r.stub.Infer(request(), metadata=(*PAID, ("traceparent", TRACEPARENT)))
    root, children = tree(await collector.trace(bytes.fromhex(TRACE_ID)))
    assert attributes(root)["ferry.status"] == "UNAVAILABLE" and attributes(root)["ferry.attempts"] == 2
    forwards = children["forward"]
    assert [attributes(f)["ferry.outcome"] for f in forwards] == ["unavailable", "unavailable"]
    assert {attributes(f)["ferry.replica"] for f in forwards} == {"r1", "r2"}
    assert all(f.status.code == trace_pb2.Status.STATUS_CODE_ERROR for f in forwards)
    assert [attributes(d)["ferry.attempt"] for d in children["decision"]] == [1, 2]
    sent = [parse_traceparent(m["traceparent"]) for rep in r.replicas.values() for m in rep.metadata]
    assert sorted(p[1] for p in sent if p) == sorted(int.from_bytes(f.span_id, "big") for f in forwards)


MALFORMED = {
    "garbage": "not a traceparent",
    "upper-case": TRACEPARENT.upper(),
    "version ff": f"ff-{TRACE_ID}-{PARENT_ID}-01",
    "zero trace id": f"00-{'0' * 32}-{PARENT_ID}-01",
    "zero parent": f"00-{TRACE_ID}-{'0' * 16}-01",
    "00 with more": TRACEPARENT + "-extra",
    "short trace id": f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
    "no dashes": f"00{TRACE_ID}{PARENT_ID}01xxx",
}


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_parse_refuses_malformed_traceparents(value) -> None:
    assert parse_traceparent(value) is None


def test_parse_reads_version_00_and_later_versions() -> None:
    assert parse_traceparent(TRACEPARENT) == (int(TRACE_ID, 16), int(PARENT_ID, 16), True)
    assert parse_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-00") == (int(TRACE_ID, 16), int(PARENT_ID, 16), False)
    assert parse_traceparent(f"01-{TRACE_ID}-{PARENT_ID}-03-more") == (int(TRACE_ID, 16), int(PARENT_ID, 16), True)
    assert tracing.format_traceparent(int(TRACE_ID, 16), int(PARENT_ID, 16)) == TRACEPARENT


@pytest.mark.parametrize("value", ["not a traceparent", f"00-{'0' * 32}-{PARENT_ID}-01", "x" * 300],
                         ids=["garbage", "zero trace id", "long"])
async def test_a_malformed_traceparent_is_ignored_and_a_new_trace_starts(rig, collector, value) -> None:
    r = await rig({"r1": Behaviour(chunks=2)}, settings=traced(collector))
    chunks = [c async for c in r.stub.InferStream(request(), metadata=(*PAID, ("traceparent", value)))]
    assert chunks[-1].final  # served as any request: never an error
    root, _ = tree(await collector.trace())
    assert not root.parent_span_id and root.trace_id != bytes(16) and root.trace_id.hex() not in value
    sent = parse_traceparent(r.replicas["r1"].metadata[0]["traceparent"])
    assert sent is not None and sent[0].to_bytes(16, "big") == root.trace_id


async def test_a_caller_that_does_not_sample_gets_no_trace_and_ratio_zero_traces_nothing(rig, collector) -> None:
    r = await rig({"r1": Behaviour()}, settings=traced(collector, trace_sample_ratio=0.0))
    await r.stub.Infer(request(), metadata=(*PAID, ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00")))
    await r.stub.Infer(request(), metadata=PAID)  # no context: the ratio decides, and it is 0
    await r.proxy.stop(0)  # the exporter sends what is queued before it stops
    r.proxy = None
    assert collector.requests == []
    assert all("traceparent" not in m for m in r.replicas["r1"].metadata)


async def test_tracing_off_makes_nothing_and_sends_no_context(rig, monkeypatch) -> None:
    made: list[str] = []
    for cls in (tracing.RequestTrace, tracing.Span):
        init = cls.__init__

        def counting(self: Any, *args: Any, _init: Any = init, **kwargs: Any) -> None:
            made.append(type(self).__name__)
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    r = await rig({"r1": Behaviour(chunks=3)})
    assert r.proxy.tracer is None and r.proxy.router.tracer is None
    metadata = (*PAID, ("traceparent", TRACEPARENT))
    await r.stub.Infer(request(), metadata=metadata)
    [c async for c in r.stub.InferStream(request(), metadata=metadata)]
    with pytest.raises(grpc.aio.AioRpcError):
        await r.stub.Infer(request(model="nope"), metadata=metadata)
    assert made == []
    assert [("traceparent" in m) for m in r.replicas["r1"].metadata] == [False, False]
    assert r.proxy.metrics.value("proxy_trace_spans_total", outcome="exported") == 0


def a_trace(tracer: Tracer, spans: int) -> tracing.RequestTrace:
    trace = tracer.begin("t", "", "")
    assert trace is not None
    for _ in range(spans - 1):
        trace.end(trace.start("s", {}))
    return trace


def test_the_export_queue_is_bounded_and_a_trace_that_does_not_fit_is_dropped_and_counted() -> None:
    from prometheus_client import CollectorRegistry, Counter
    counter = Counter("spans", "", ["outcome"], registry=CollectorRegistry())
    settings = TraceSettings(trace_endpoint="127.0.0.1:1", trace_insecure=True, trace_queue_spans=10,
                             trace_batch_spans=5)
    tracer = Tracer(settings, counter=counter)
    for spans in (4, 4, 4, 2):
        a_trace(tracer, spans).finish("OK", {})
    assert tracer.exporter.queued == 10
    assert counter.labels("dropped")._value.get() == 4
    assert a_trace(tracer, tracing.MAX_SPANS + 5).dropped == 5  # a trace keeps at most MAX_SPANS spans


async def test_a_collector_that_refuses_costs_the_spans_counted_as_failed(rig) -> None:
    refusing = await Collector(fail=grpc.StatusCode.UNAVAILABLE).start()
    try:
        r = await rig({"r1": Behaviour()}, settings=traced(refusing))
        await r.stub.Infer(request(), metadata=PAID)  # served whatever the collector does
        await refusing.trace()
        await r.proxy.stop(0)
        failed = r.proxy.metrics.value("proxy_trace_spans_total", outcome="failed")
        r.proxy = None
        assert failed >= 3 and len(refusing.spans()) == failed
    finally:
        await refusing.stop()


@pytest.mark.parametrize(("values", "key"), [
    ({"trace_endpoint": "nohost"}, "proxy.trace_endpoint"),
    ({"trace_endpoint": "h:99999"}, "proxy.trace_endpoint"),
    ({"trace_sample_ratio": 1.5}, "proxy.trace_sample_ratio"),
    ({"trace_queue_spans": 0}, "proxy.trace_queue_spans"),
    ({"trace_batch_spans": 4096}, "proxy.trace_batch_spans"),
    ({"trace_insecure": True, "trace_ca": "ca.pem"}, "proxy.trace_ca"),
    ({"trace_endpoint": "h:4317", "trace_color": "blue"}, "proxy.trace_color"),
], ids=["no port", "bad port", "ratio", "queue", "batch over queue", "ca and insecure", "unknown key"])
def test_bad_trace_settings_name_their_key(values, key) -> None:
    with pytest.raises(ConfigError) as error:
        ProxySettings.from_section(values)
    assert error.value.key == key


def test_an_unreadable_ca_names_its_key(tmp_path) -> None:
    from prometheus_client import CollectorRegistry, Counter
    settings = TraceSettings(trace_endpoint="h:4317", trace_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError) as error:
        Exporter(settings, counter=Counter("c", "", ["outcome"], registry=CollectorRegistry()))
    assert "proxy.trace_ca" in str(error.value)



def test_the_manifests_commented_trace_settings_load_once_uncommented() -> None:
    text = (Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/ferry.toml").read_text()
    lines = [line.removeprefix("# ") for line in text.splitlines() if line.startswith("# trace_")]
    section = tomllib.loads("\n".join(lines))
    assert set(section) == {"trace_endpoint", "trace_insecure", "trace_sample_ratio"}
    settings = ProxySettings.from_section(section).tracing
    assert settings.trace_endpoint.endswith(":4317") and settings.trace_sample_ratio == 0.1
