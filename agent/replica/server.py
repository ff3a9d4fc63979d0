"""The simulated replica: Triton's ``GRPCInferenceService`` in front of one real-time engine.

:class:`ReplicaServicer` speaks KServe v2 / Triton gRPC (the stubs shipped in
tritonclient) for one model and version, with the tensors and response
parameters of docs/CONTRACTS.md:

- ``ModelInfer``: the whole text once the engine finished the request.
- ``ModelStreamInfer`` (decoupled): one response per engine step with the
  text since the previous response (a slow reader gets several steps in one),
  the last with ``triton_final_response`` = true and the summary parameters;
  ``stream`` = false gives one final response. The answer ends where
  :func:`agent.replica.answer.answer_limit` says (a natural end unless
  ``ignore_eos``, a stop string, or ``max_tokens``), and
  ``ferry_finish_reason`` says why (``stop`` or ``length``). What the text
  is, words, JSON for ``guided_json`` or a ``<tool_call>`` block for a
  prompt offering tools, is :mod:`agent.replica.model`'s. Several requests may share a
  stream (at most ``max_stream_requests`` in flight). An admission error
  ends the stream with its status, as a unary call would.
- Errors: unknown model or version -> NOT_FOUND; malformed tensor ->
  INVALID_ARGUMENT naming it; queue full -> RESOURCE_EXHAUSTED; every RPC
  of the service that a replica does not serve -> UNIMPLEMENTED.
- A client that cancels (or whose deadline passes) cancels its request in
  the engine, which frees its KV blocks.

:class:`SimulatedReplica` runs one replica: the gRPC server, the engine task
(:class:`agent.replica.runner.EngineRunner`) and a Prometheus text endpoint
(:mod:`agent.replica.metrics`) at ``/metrics``, served with ``aiohttp.web``;
given a ``face`` (a :class:`FaceFactory`, such as the HTTP face of
``tools.peers.replicaface``, which speaks SGLang's and OpenAI's APIs for the
peer routers' benchmarks), also that face on the same runner. Every face
admits prompts with :meth:`agent.replica.runner.EngineRunner.submit_prompt`,
so a request's text, cached tokens and the prefix-cache counters do not
depend on the face it came through.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

import grpc
from aiohttp import web
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from agent.replica import logprobs, model, tensors
from agent.replica import metrics as replica_metrics
from agent.replica.answer import Limit, answer_limit
from agent.replica.engine import Engine, EngineParams, Finished
from agent.replica.runner import EngineRunner, Ticket
from ferry.errors import FerryError, NotFound, Unavailable
from ferry.grpcutil import start_server, status_for
from ferry.tls import TLSConfig
from ferry.tokens import WHITESPACE, Tokenizer

SERVICE = "inference.GRPCInferenceService"
PLATFORM = "ferry_simulated_llm"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Face(Protocol):
    """A face of a replica beside its gRPC one, on the same engine runner: started on a host, stopped once."""

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host:port`` (0: the system picks); returns the bound port."""
        ...

    async def stop(self) -> None:
        """Stop listening and end what runs (its requests are cancelled in the engine)."""
        ...


class FaceFactory(Protocol):
    """Makes a replica's :class:`Face`: its ``model`` name, the ``runner`` it admits prompts on, and ``loaded``
    (false while the model loads)."""

    def __call__(self, *, model: str, runner: EngineRunner, loaded: Callable[[], bool]) -> Face: ...


def _logprob_outputs(parsed: tensors.LlmRequest, ticket: Ticket, start: int,
                     count: int) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The log-probability outputs of tokens ``start``.. of the answer, when the request asked for them
    (``return_log_probs``, with ``top_logprobs`` alternatives): :mod:`agent.replica.logprobs`."""
    if not parsed.sampling.get("logprobs") or not count:
        return []
    top = parsed.sampling.get("top_logprobs", 0)
    return logprobs.outputs(ticket.answer.tokens(start, count), start, top if isinstance(top, int) else 0)


def _summary(f: Finished) -> dict[str, bool | int | float]:
    return {"ferry_prompt_tokens": f.prompt_tokens, "ferry_cached_tokens": f.cached_tokens,
            "ferry_queue_seconds": f.queue_seconds, "ferry_service_seconds": f.service_seconds}


def _unimplemented(rpc: str) -> Callable[[Any, Any, Any], Awaitable[NoReturn]]:
    async def handler(self: Any, request: Any, context: Any) -> NoReturn:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is not served by a ferry simulated replica")
        raise AssertionError("abort returned")

    handler.__name__ = handler.__qualname__ = rpc
    return handler


def _stops(parsed: tensors.LlmRequest) -> tuple[str, ...]:
    stops = parsed.sampling.get("stop")
    return stops if isinstance(stops, tuple) else ()


def stop_limit(parsed: tensors.LlmRequest, params: EngineParams | None = None) -> Limit:
    """Where the answer to a KServe request ends (:func:`agent.replica.answer.answer_limit`): its natural end
    under ``params`` (None: none), its first stop string, or ``max_tokens`` (``length``).

    Seeded sampling is a no-op here: the reply is the same words whatever the seed or temperature.
    """
    return answer_limit(parsed.prompt, parsed.max_tokens, _stops(parsed), params=params,
                        ignore_eos=parsed.ignore_eos)


class ReplicaServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Triton's gRPC service for one model version served by one engine."""

    def __init__(self, *, model: str, version: str, runner: EngineRunner, max_stream_requests: int = 256,
                 ready_at: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.model, self.version, self.runner = model, version, runner
        self.max_stream_requests = max_stream_requests
        self.ready_at, self._clock = ready_at, clock  # the model loads until ready_at (clock's time)

    # -- health, metadata, statistics ------------------------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._serves(request.name, request.version) and self._loaded())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        await self._check(request.name, request.version, context)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.model, versions=[self.version], platform=PLATFORM,
            inputs=[tensor(name=n, datatype=t, shape=[-1, 1]) for n, t in tensors.INPUTS.items()],
            outputs=[tensor(name=tensors.OUTPUT, datatype="BYTES", shape=[-1, -1])],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        await self._check(request.name, request.version, context)
        p = self.runner.engine.params
        types = {"BYTES": mc.TYPE_STRING, "INT32": mc.TYPE_INT32, "BOOL": mc.TYPE_BOOL, "FP32": mc.TYPE_FP32,
                 "UINT64": mc.TYPE_UINT64}
        config = mc.ModelConfig(
            name=self.model, platform=PLATFORM, backend="ferry", max_batch_size=p.max_running,
            input=[mc.ModelInput(name=n, data_type=types[t], dims=[1], optional=n in tensors.OPTIONAL)
                   for n, t in tensors.INPUTS.items()]
            + [mc.ModelInput(name=n, data_type=types[t], dims=[-1], optional=True)
               for n, t in tensors.SAMPLING_INPUTS.items()],
            output=[mc.ModelOutput(name=tensors.OUTPUT, data_type=mc.TYPE_STRING, dims=[-1])],
            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
        )
        for key, value in (("ferry_kv_block_tokens", p.kv_block_tokens), ("ferry_kv_blocks_total", p.kv_blocks_total),
                           ("ferry_max_context_tokens", p.max_context_tokens), ("ferry_max_queue", p.max_queue)):
            config.parameters[key].string_value = str(value)
        return pb.ModelConfigResponse(config=config)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        state = "READY" if self._loaded() else "LOADING"
        entry = pb.RepositoryIndexResponse.ModelIndex(name=self.model, version=self.version, state=state)
        return pb.RepositoryIndexResponse(models=[entry])

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        if request.name:
            await self._check(request.name, request.version, context)
        s, load = self.runner.stats, self.runner.engine.load()
        ns = 1e9

        def duration(count: int, seconds: float) -> pb.StatisticDuration:
            return pb.StatisticDuration(count=count, ns=round(seconds * ns))

        stats = pb.ModelStatistics(
            name=self.model, version=self.version, last_inference=round(s.last_inference * 1000),
            inference_count=s.success, execution_count=load.steps,
            inference_stats=pb.InferStatistics(
                success=duration(s.success, s.queue_seconds + s.compute_seconds),
                fail=duration(s.rejected + s.cancelled, 0.0),
                queue=duration(s.success, s.queue_seconds),
                compute_infer=duration(s.success, s.compute_seconds),
            ),
        )
        return pb.ModelStatisticsResponse(model_stats=[stats])

    # -- inference -------------------------------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        ticket, parsed = await self._admit(request, context)
        try:
            while ticket.finished is None:
                await ticket.next()
        finally:
            if ticket.finished is None:
                self.runner.cancel(ticket)
        f = ticket.finished
        assert f is not None
        return tensors.text_response(
            model=self.model, version=self.version, request_id=request.id,
            text=ticket.answer.text(0, ticket.emitted),
            parameters={**_summary(f), "ferry_completion_tokens": ticket.emitted,
                        "ferry_finish_reason": ticket.answer.reason},
            extra=_logprob_outputs(parsed, ticket, 0, ticket.emitted),
        )

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> None:
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for request in request_iterator:
                if len(tasks) >= self.max_stream_requests:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"more than {self.max_stream_requests} requests in flight on one stream")
                ticket, parsed = await self._admit(request, context)
                incremental = parsed.stream is not False
                task = asyncio.create_task(self._stream_one(request.id, incremental, ticket, context, lock,
                                                            parsed))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_one(self, request_id: str, incremental: bool, ticket: Ticket, context: Any,
                          lock: asyncio.Lock, parsed: tensors.LlmRequest) -> None:
        sent = 0
        try:
            while True:
                _, finished = await ticket.next()
                if not incremental and finished is None:
                    continue
                count = ticket.emitted - sent
                params: dict[str, bool | int | float | str] = {"ferry_completion_tokens": count,
                                                               "triton_final_response": finished is not None}
                if finished is not None:
                    params.update(_summary(finished))
                    params["ferry_finish_reason"] = ticket.answer.reason
                response = tensors.text_response(model=self.model, version=self.version, request_id=request_id,
                                                 text=ticket.answer.text(sent, count), parameters=params,
                                                 extra=_logprob_outputs(parsed, ticket, sent, count))
                sent += count
                async with lock:
                    await context.write(pb.ModelStreamInferResponse(infer_response=response))
                if finished is not None:
                    return
        finally:
            if ticket.finished is None:
                self.runner.cancel(ticket)

    async def _admit(self, request: pb.ModelInferRequest,
                     context: Any) -> tuple[Ticket, tensors.LlmRequest]:
        try:
            self._check_or_raise(request.model_name, request.model_version)
            if not self._loaded():
                raise Unavailable(f"model {self.model}/{self.version} is loading "
                                  f"({self.ready_at - self._clock():.1f} s left)")
            parsed = tensors.parse_request(request)
            guided = parsed.sampling.get("guided_json")
            script = model.kserve_script(parsed.prompt, guided if isinstance(guided, tuple) else None)
            ticket, _ = self.runner.submit_prompt(parsed.prompt, parsed.max_tokens, stops=_stops(parsed),
                                                  ignore_eos=parsed.ignore_eos, prompt_field="text_input",
                                                  script=script.tokens if script is not None else None)
            return ticket, parsed
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise  # not reached: abort raises

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _loaded(self) -> bool:
        return self._clock() >= self.ready_at

    def _serves(self, name: str, version: str) -> bool:
        return name == self.model and version in ("", self.version)

    def _check_or_raise(self, name: str, version: str) -> None:
        if name != self.model:
            raise NotFound("model", name)
        if version not in ("", self.version):
            raise NotFound("model version", f"{name}/{version}")

    async def _check(self, name: str, version: str, context: Any) -> None:
        try:
            self._check_or_raise(name, version)
        except NotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    # -- the rest of the service: UNIMPLEMENTED, with a message ---------------------------------------------------

    ServerMetadata = _unimplemented("ServerMetadata")
    RepositoryModelLoad = _unimplemented("RepositoryModelLoad")
    RepositoryModelUnload = _unimplemented("RepositoryModelUnload")
    SystemSharedMemoryStatus = _unimplemented("SystemSharedMemoryStatus")
    SystemSharedMemoryRegister = _unimplemented("SystemSharedMemoryRegister")
    SystemSharedMemoryUnregister = _unimplemented("SystemSharedMemoryUnregister")
    CudaSharedMemoryStatus = _unimplemented("CudaSharedMemoryStatus")
    CudaSharedMemoryRegister = _unimplemented("CudaSharedMemoryRegister")
    CudaSharedMemoryUnregister = _unimplemented("CudaSharedMemoryUnregister")
    TraceSetting = _unimplemented("TraceSetting")
    LogSettings = _unimplemented("LogSettings")


class SimulatedReplica:
    """One simulated replica: gRPC server, engine task, metrics endpoint and (given a ``face``) one more face, all on
    ``host``."""

    def __init__(self, model: str, version: str = "v1", *, params: EngineParams | None = None,
                 host: str = "127.0.0.1", replica_id: str = "", tls: TLSConfig | None = None,
                 warmup_seconds: float = 0.0, face: FaceFactory | None = None,
                 tokenizer: Tokenizer = WHITESPACE) -> None:
        self.model, self.version, self.host = model, version, host
        self.tokenizer = tokenizer  # the model's tokens, as the proxy counts them (ferry.tokens)
        self.face = face  # also serve this face (an HTTP one: tools.peers.replicaface) on the same runner
        self.warmup_seconds = warmup_seconds  # ModelReady says false (inference UNAVAILABLE) this long after start
        self.tls = tls  # mutual TLS with the node's certificate (None: plain text)
        self.params = params or EngineParams()
        self.replica_id = replica_id or f"{model}-{version}"
        self.runner: EngineRunner | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._face: Face | None = None
        self.port = self.metrics_port = self.http_port = 0

    @property
    def http(self) -> bool:
        """Whether the replica serves a face beside gRPC (its ``http_port``, ``http_url``)."""
        return self.face is not None

    @property
    def address(self) -> str:
        """``host:port`` of the KServe v2 gRPC endpoint."""
        return f"{self.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        """``host:port`` of the metrics endpoint."""
        return f"{self.host}:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.metrics_address}/metrics"

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP face (raises when it is off)."""
        if not self.http:
            raise RuntimeError(f"replica {self.replica_id}: the HTTP face is off (no face given)")
        return f"http://{self.host}:{self.http_port}"

    async def start(self) -> SimulatedReplica:
        """Start the engine task, the gRPC server, the metrics endpoint and the face (ports the system picks)."""
        runner = self.runner = EngineRunner(Engine(self.params), tokenizer=self.tokenizer)
        self._task = asyncio.create_task(runner.run(), name=f"engine-{self.replica_id}")
        ready_at = time.monotonic() + self.warmup_seconds
        servicer = ReplicaServicer(model=self.model, version=self.version, runner=runner, ready_at=ready_at)
        if self.face is not None:
            self._face = self.face(model=self.model, runner=runner, loaded=lambda: time.monotonic() >= ready_at)
            self.http_port = await self._face.start(self.host)
        add = service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
        creds = self.tls.server_credentials(require_client_cert=True) if self.tls else None
        self._server, self.port = await start_server([(add, servicer, SERVICE)], f"{self.host}:0", credentials=creds)
        self._metrics, self.metrics_port = await self._serve_metrics()
        return self

    async def _serve_metrics(self) -> tuple[web.AppRunner, int]:
        """``GET /metrics`` (:meth:`render_metrics`) with ``aiohttp.web`` on ``host`` (a port the system picks)."""

        async def scrape(_: web.Request) -> web.Response:
            return web.Response(body=self.render_metrics().encode("utf-8"),
                                headers={"Content-Type": METRICS_CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", scrape, allow_head=False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, 0).start()
        return runner, int(runner.addresses[0][1])

    def render_metrics(self) -> str:
        """The replica's Prometheus text."""
        assert self.runner is not None
        return replica_metrics.render(
            model=self.model, version=self.version, load=self.runner.engine.load(), stats=self.runner.stats,
            utilization=self.runner.utilization(), gpu_uuid=f"GPU-sim-{self.replica_id}")

    async def stop(self, grace: float = 0.5) -> None:
        """Stop serving (in-flight gRPC calls get ``grace`` seconds; the face's requests are cancelled), then the
        engine task and the metrics endpoint."""
        if self._face is not None:
            await self._face.stop()
            self._face = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._metrics is not None:
            await self._metrics.cleanup()
            self._metrics = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> SimulatedReplica:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
