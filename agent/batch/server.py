"""KServe v2 gRPC front of the batch runtime, so the proxy reaches it like any replica.

Implements ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata,
RepositoryIndex, ModelStatistics and ModelInfer of
``inference.GRPCInferenceService``; every other RPC answers UNIMPLEMENTED.
Tensors follow docs/CONTRACTS.md: one ``text_input`` BYTES element in (shape
``[1, 1]`` or ``[1]``, raw or typed contents), ``text_output`` BYTES ``[1, 1]``
out, the request id echoed, ``ferry_queue_seconds`` and
``ferry_service_seconds`` in the response parameters. Every other input (the
proxy's ``max_tokens``, a ``stream`` flag) is accepted and ignored: a fixed
batch contract has no token budget. Tenant and plan come from the request
parameters ``ferry_tenant`` and ``ferry_plan`` (defaults ``anonymous`` and
``paid``) and decide the fill order; ``ferry_tier`` and ``priority`` are
ignored. Errors are FerryErrors mapped to a status here and nowhere else (a
full queue is RESOURCE_EXHAUSTED with ``retry-after`` seconds in the trailing
metadata, from the queue's drain rate; a model the node cannot run
UNAVAILABLE).

Fault injection, off unless the server is built with ``allow_faults`` (the
``--allow-fault-injection`` flag): a ModelInfer on the reserved model name
``ferry.fault`` whose ``text_input`` is ``kill`` (the GPU of the oldest
running batch), ``kill N`` or ``restore N`` acts on that GPU and answers a
JSON report in ``text_output``.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.batch.runtime import BatchRuntime
from ferry import grpcutil
from ferry.errors import FerryError, InvalidArgument, NotFound, Overloaded, PermissionDenied
from ferry.tls import TLSConfig

SERVICE = "inference.GRPCInferenceService"
FAULT_MODEL = "ferry.fault"
MAX_INPUT_BYTES = 1024 * 1024
MAX_TENANT_BYTES = 128


def decode_bytes_tensor(raw: bytes) -> list[bytes]:
    """Triton's raw BYTES layout: each element is a 4-byte little-endian length, then the bytes."""
    items, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise InvalidArgument("text_input", "truncated BYTES tensor")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise InvalidArgument("text_input", "truncated BYTES tensor")
        items.append(raw[at : at + size])
        at += size
    return items


def encode_bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def _text_input(request: Any) -> str:
    for i, tensor in enumerate(request.inputs):
        if tensor.name != "text_input":
            continue
        if tensor.datatype != "BYTES":
            raise InvalidArgument("text_input", f"datatype must be BYTES, got {tensor.datatype}")
        if i < len(request.raw_input_contents):
            items = decode_bytes_tensor(request.raw_input_contents[i])
        else:
            items = list(tensor.contents.bytes_contents)
        if len(items) != 1:
            raise InvalidArgument("text_input", f"one element per request, got {len(items)}")
        if len(items[0]) > MAX_INPUT_BYTES:
            raise InvalidArgument("text_input", f"over {MAX_INPUT_BYTES} bytes")
        try:
            return str(items[0].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidArgument("text_input", "not UTF-8") from exc
    raise InvalidArgument("text_input", "missing")


def _string_param(request: Any, key: str, default: str) -> str:
    if key not in request.parameters:
        return default
    value = str(request.parameters[key].string_param)
    if not value or len(value.encode()) > MAX_TENANT_BYTES:
        raise InvalidArgument(key, f"must be 1 to {MAX_TENANT_BYTES} bytes")
    return value


def _text_response(request: Any, model: str, version: str, text: str) -> Any:
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version, id=request.id)
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(encode_bytes_tensor([text.encode("utf-8")]))
    return response


class BatchServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``inference.GRPCInferenceService`` over a :class:`BatchRuntime`; holds no policy."""

    def __init__(self, runtime: BatchRuntime, *, allow_faults: bool = False) -> None:
        self.runtime = runtime
        self.allow_faults = allow_faults

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.runtime.running)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="ferry-batch-runtime", version=self.runtime.version)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready, _reason = self.runtime.model_status(request.name)
        return service_pb2.ModelReadyResponse(ready=ready and request.version in ("", self.runtime.version))

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        if request.name not in self.runtime.models:
            await self._abort(context, NotFound("model", request.name))
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=request.name, versions=[self.runtime.version], platform="ferry_batch",
            inputs=[tensor(name="text_input", datatype="BYTES", shape=[-1])],
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[-1])])

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        response = service_pb2.RepositoryIndexResponse()
        for model in self.runtime.models:
            ready, reason = self.runtime.model_status(model)
            response.models.add(name=model, version=self.runtime.version, state="READY" if ready else "UNAVAILABLE",
                                reason=reason)
        return response

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name and request.name not in self.runtime.models:
            await self._abort(context, NotFound("model", request.name))
        response = service_pb2.ModelStatisticsResponse()
        for model in [request.name] if request.name else self.runtime.models:
            c = self.runtime.counters[model]
            stats = response.model_stats.add(name=model, version=self.runtime.version, last_inference=c.last_answer_ms,
                                             inference_count=c.answered, execution_count=c.batches)
            inference = stats.inference_stats
            inference.success.count, inference.success.ns = c.answered, int(c.service_s * 1e9)
            inference.fail.count = c.failed
            inference.queue.count, inference.queue.ns = c.answered, int(c.queue_s * 1e9)
            inference.compute_infer.count, inference.compute_infer.ns = c.batches, int(c.compute_s * 1e9)
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        try:
            text = _text_input(request)
            if request.model_name == FAULT_MODEL:
                return _text_response(request, FAULT_MODEL, self.runtime.version, self._fault(text))
            if request.model_version not in ("", self.runtime.version):
                raise NotFound("model version", f"{request.model_name}/{request.model_version}")
            answer = await self.runtime.infer(
                request.model_name, text,
                tenant=_string_param(request, "ferry_tenant", "anonymous"),
                plan=_string_param(request, "ferry_plan", "paid"))
        except FerryError as exc:
            await self._abort(context, exc)
        self.runtime.counters[request.model_name].last_answer_ms = int(time.time() * 1e3)
        response = _text_response(request, request.model_name, self.runtime.version, answer.text)
        response.parameters["ferry_queue_seconds"].double_param = answer.queue_s
        response.parameters["ferry_service_seconds"].double_param = answer.service_s
        return response

    def _fault(self, command: str) -> str:
        if not self.allow_faults:
            raise PermissionDenied("fault injection is off (start with --allow-fault-injection)")
        gpus = self.runtime.node.scheduler.config.gpus
        words = command.split()
        usage = f"expected 'kill', 'kill N' or 'restore N' with 0 <= N < {gpus}"
        if not words or words[0] not in ("kill", "restore") or len(words) > 2:
            raise InvalidArgument("text_input", usage)
        gpu = None
        if len(words) == 2:
            if not words[1].isdigit() or int(words[1]) >= gpus:
                raise InvalidArgument("text_input", usage)
            gpu = int(words[1])
        if words[0] == "restore":
            if gpu is None:
                raise InvalidArgument("text_input", usage)
            return json.dumps({"gpu": gpu, "restored": self.runtime.restore_gpu(gpu)})
        report = self.runtime.kill_gpu(gpu)
        return json.dumps({"gpu": report.gpu, "batch_id": report.batch_id, "model": report.model,
                           "requeued": len(report.requeued), "failed": len(report.failed),
                           "unavailable": list(report.unavailable)})

    async def _abort(self, context: Any, error: FerryError) -> NoReturn:
        trailing: tuple[tuple[str, str], ...] = ()
        if isinstance(error, Overloaded):
            trailing = (("retry-after", f"{error.retry_after:.3g}"),)
        await context.abort(grpcutil.status_for(error), str(error), trailing_metadata=trailing)
        raise AssertionError("context.abort returned")

    async def _unimplemented(self, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented by the batch runtime")

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await self._unimplemented(context)
        yield  # pragma: no cover - makes this an async generator, as the streaming RPC needs

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)

    async def LogSettings(self, request: Any, context: Any) -> Any:
        return await self._unimplemented(context)


async def serve(runtime: BatchRuntime, listen: str, *, allow_faults: bool = False,
                tls: TLSConfig | None = None) -> tuple[grpc.aio.Server, int]:
    """Start the KServe server for ``runtime`` on ``listen`` (port 0 allowed; mutual TLS with ``tls``)."""
    servicer = BatchServicer(runtime, allow_faults=allow_faults)
    creds = tls.server_credentials(require_client_cert=True) if tls else None
    return await grpcutil.start_server(
        [(service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, servicer, SERVICE)], listen, credentials=creds)
