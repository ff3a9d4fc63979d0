"""Fakes for the proxy's tests: KServe v2 replicas with per-replica behaviours, a Tables control plane.

Both are real ``grpc.aio`` servers on 127.0.0.1, port 0. Tests wait on their
events and queues (a request arrived, a call was cancelled, an Ack came),
never on sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.v1 import common_pb2, tables_pb2, tables_pb2_grpc


@dataclasses.dataclass
class Behaviour:
    """What a fake replica does with each request.

    kind: ``ok`` (answer), ``fail`` (abort with ``code`` before any output),
    ``hang`` (wait until cancelled), ``die`` (stream: one chunk, then fail),
    ``stall`` (stream: one chunk, then wait until cancelled).
    ``chunks``: streamed responses; ``delay``: seconds before answering;
    ``report``: send the ``ferry_*`` parameters (a real Triton does not);
    ``final_flag``: mark the last streamed response with ``triton_final_response``;
    ``script``: answer these pieces (streamed one per response) instead of made-up words.
    """

    kind: str = "ok"
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    chunks: int = 3
    delay: float = 0.0
    report: bool = True
    final_flag: bool = True
    die_with_error_message: bool = False
    script: tuple[str, ...] = ()  # the answer's pieces as they are streamed (unary: joined), instead of words
    logprobs: bool = False  # answer log probabilities when the request asks (return_log_probs)


async def serve(add: Callable[[Any, grpc.aio.Server], None], servicer: Any,
                port: int = 0) -> tuple[grpc.aio.Server, int]:
    """A started ``grpc.aio`` server of ``servicer`` (added by ``add``) on 127.0.0.1:``port`` (0: any free one),
    and its port."""
    server = grpc.aio.server()
    add(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


def _bytes_input(request: Any, index: int) -> bytes:
    raw = request.raw_input_contents[index]
    (length,) = struct.unpack_from("<I", raw)
    return bytes(raw[4:4 + length])


def parse(request: Any) -> tuple[str, int, bool]:
    """(prompt, max_tokens, stream flag) of a ModelInferRequest."""
    prompt, max_tokens, stream = "", 0, False
    for i, tensor in enumerate(request.inputs):
        if tensor.name == "text_input":
            prompt = _bytes_input(request, i).decode()
        elif tensor.name == "max_tokens":
            max_tokens = int(np.frombuffer(request.raw_input_contents[i], dtype=np.int32)[0])
        elif tensor.name == "stream":
            stream = bool(np.frombuffer(request.raw_input_contents[i], dtype=np.bool_)[0])
    return prompt, max_tokens, stream


def response(request: Any, text: str, params: dict[str, Any], *, logprobs: bool = False) -> Any:
    """A ModelInferResponse with ``text_output`` = ``text`` and the given parameters; with ``logprobs``, each word
    of ``text`` with a log probability (-0.5 per word of its place) and two alternatives, as docs/CONTRACTS.md
    has them (``output_log_probs``, ``output_tokens``, ``top_logprobs``)."""
    reply = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
    out = reply.outputs.add()
    out.name, out.datatype = "text_output", "BYTES"
    out.shape.extend([1, 1])
    data = text.encode()
    reply.raw_output_contents.append(struct.pack("<I", len(data)) + data)
    if logprobs:
        tokens = [w + " " for w in text.split()]
        for name, datatype, raw in (
                ("output_log_probs", "FP32", b"".join(struct.pack("<f", -0.5 * (i + 1)) for i in range(len(tokens)))),
                ("output_tokens", "BYTES", b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in tokens)),
                ("top_logprobs", "BYTES", b"".join(
                    struct.pack("<I", len(j)) + j for j in (json.dumps({t: -0.5 * (i + 1), "x": -9.0}).encode()
                                                            for i, t in enumerate(tokens))))):
            extra = reply.outputs.add()
            extra.name, extra.datatype = name, datatype
            extra.shape.extend([1, len(tokens)])
            reply.raw_output_contents.append(raw)
    for key, value in params.items():
        if isinstance(value, bool):
            reply.parameters[key].bool_param = value
        elif isinstance(value, int):
            reply.parameters[key].int64_param = value
        else:
            reply.parameters[key].double_param = float(value)
    return reply


class FakeReplica(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A KServe v2 replica that answers ``min(max_tokens, 5)`` words, or misbehaves per its Behaviour."""

    def __init__(self, replica_id: str, behaviour: Behaviour | None = None) -> None:
        self.replica_id = replica_id
        self.behaviour = behaviour or Behaviour()
        self.requests: list[Any] = []
        self.deadlines: list[float | None] = []  # each request's time remaining when it arrived
        self.metadata: list[dict[str, str]] = []  # each request's call metadata (the trace context, say)
        self.received = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self, port: int = 0) -> FakeReplica:
        """Serve on 127.0.0.1:``port`` (0: any free port)."""
        self.server, port = await serve(service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, self, port)
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    def _words(self, request: Any) -> list[str]:
        _prompt, max_tokens, _ = parse(request)
        return [f"{self.replica_id}w{i}" for i in range(min(max_tokens, 5))]

    def _params(self, request: Any, completion: int) -> dict[str, Any]:
        if not self.behaviour.report:
            return {}
        prompt, _, _ = parse(request)
        return {"ferry_prompt_tokens": len(prompt.split()), "ferry_completion_tokens": completion,
                "ferry_cached_tokens": 1, "ferry_queue_seconds": 0.25, "ferry_service_seconds": 0.5}

    async def _before(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        self.deadlines.append(context.time_remaining())
        self.metadata.append({key: value for key, value in context.invocation_metadata() or ()
                              if isinstance(value, str)})
        self.received.set()
        b = self.behaviour
        if b.kind == "fail":
            await context.abort(b.code, f"{self.replica_id}: injected failure")
        if b.kind == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if b.delay:
            try:
                await asyncio.sleep(b.delay)  # simulated work, not a wait for readiness
            except asyncio.CancelledError:
                self.cancelled.set()
                raise

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._before(request, context)
        asked = self._asked(request)
        if self.behaviour.script:
            text = "".join(self.behaviour.script)
            return response(request, text, self._params(request, len(self.behaviour.script)), logprobs=asked)
        words = self._words(request)
        return response(request, " ".join(words), self._params(request, len(words)), logprobs=asked)

    def _asked(self, request: Any) -> bool:
        """Log probabilities asked (``return_log_probs``) and this replica answers them."""
        return self.behaviour.logprobs and any(t.name == "return_log_probs" for t in request.inputs)

    async def ModelStreamInfer(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        request = await anext(aiter(request_iterator))
        await self._before(request, context)
        _, max_tokens, _ = parse(request)
        script = self.behaviour.script
        n = len(script) if script else min(self.behaviour.chunks, max_tokens)
        for i in range(n):
            if self.behaviour.kind == "die" and i == 1:
                if self.behaviour.die_with_error_message:
                    yield service_pb2.ModelStreamInferResponse(error_message="replica died")
                    return
                await context.abort(grpc.StatusCode.INTERNAL, "replica died mid-stream")
            if self.behaviour.kind == "stall" and i == 1:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            params = self._params(request, 1)
            if i == n - 1 and self.behaviour.final_flag:
                params["triton_final_response"] = True
            yield service_pb2.ModelStreamInferResponse(
                infer_response=response(request, script[i] if script else f"{self.replica_id}c{i} ", params,
                                        logprobs=self._asked(request))
            )


def route(replica: FakeReplica | str, address: str = "", *, version: str = "v1", node: str = "n1", queued: int = 0,
          running: int = 0, max_concurrency: int = 4, kv_free: int = 100, kv_total: int = 100,
          age: float = 0.0, state: int = common_pb2.REPLICA_STATE_READY, region: str = "local",
          inputs: Sequence[str] = ()) -> Any:
    """A ReplicaRoute for a fake replica (or an id and an address)."""
    rid = replica if isinstance(replica, str) else replica.replica_id
    addr = address or (replica.address if isinstance(replica, FakeReplica) else "127.0.0.1:1")
    return tables_pb2.ReplicaRoute(
        replica_id=rid, node=node, region=region, version=version, address=addr, kserve_model="m-kserve",
        max_concurrency=max_concurrency, kv_block_tokens=16, max_context_tokens=4096,
        load=common_pb2.ReplicaLoad(replica_id=rid, state=state, queued=queued, running=running,
                                    kv_blocks_free=kv_free, kv_blocks_total=kv_total),
        telemetry_age_seconds=age, inputs=list(inputs),
    )


def snapshot(version: int, routes: Sequence[Any], *, model: str = "m", default_version: str = "v1",
             region: str = "local", extra_models: Sequence[str] = ()) -> Any:
    """A TableSnapshot with one model (plus empty ``extra_models``)."""
    models = [tables_pb2.ModelRoute(model=model, default_version=default_version, replicas=list(routes))]
    models += [tables_pb2.ModelRoute(model=name, default_version="v1") for name in extra_models]
    return tables_pb2.TableSnapshot(version=version, nonce=f"n{version}", region=region, computed_at=1.0,
                                    models=models)


class FakeControlPlane(tables_pb2_grpc.TablesServicer):
    """Serves Tables.Watch: sends ``current`` on subscribe, then every :meth:`push`; records Acks."""

    def __init__(self, current: Any = None) -> None:
        self.current = current
        self.subscribes: asyncio.Queue[Any] = asyncio.Queue()
        self.acks: asyncio.Queue[Any] = asyncio.Queue()
        self.reports: asyncio.Queue[Any] = asyncio.Queue()  # the proxy's usage reports (dataplane.usage)
        self._streams: list[asyncio.Queue[Any]] = []
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> FakeControlPlane:
        self.server, self.port = await serve(tables_pb2_grpc.add_TablesServicer_to_server, self, port)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    def push(self, snap: Any) -> None:
        self.current = snap
        for queue in self._streams:
            queue.put_nowait(snap)

    async def next_ack(self, within: float = 5.0) -> Any:
        return await asyncio.wait_for(self.acks.get(), within)

    async def Watch(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        requests = aiter(request_iterator)
        first = await anext(requests)
        await self.subscribes.put(first.subscribe)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams.append(queue)

        async def read_acks() -> None:
            async for message in requests:
                if message.WhichOneof("body") == "report":
                    await self.reports.put(message.report)
                else:
                    await self.acks.put(message.ack)

        reader = asyncio.ensure_future(read_acks())
        try:
            if self.current is not None:
                yield self.current
            while True:
                yield await queue.get()
        finally:
            reader.cancel()
            self._streams.remove(queue)
