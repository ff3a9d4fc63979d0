"""The agent's adapter to any KServe v2 / Triton endpoint, a real Triton server or a ferry replica.

Through ``tritonclient.grpc.aio.InferenceServerClient`` and one HTTP scrape of
the endpoint's Prometheus text (:mod:`agent.scrape`: aiohttp and ``prometheus_client``'s parser):

- :meth:`TritonEndpoint.discover`: RepositoryIndex, then per model
  ModelMetadata, ModelReady and ModelConfig. Only LLM models are adopted:
  those with the ``text_input`` and ``max_tokens`` inputs and the
  ``text_output`` output of docs/CONTRACTS.md (a TensorRT-LLM repository's
  ``ensemble`` or ``tensorrt_llm_bls``, not its ``preprocessing`` or
  ``tensorrt_llm`` steps, nor a fixed-batch string model). Batch slots come from
  ``max_batch_size``; block size and context from the ``ferry_*`` config
  parameters when present; the input names its metadata and config declare go with the replica's
  registration (which sampling parameters it accepts, :mod:`ferry.sampling`). Its GPUs: the
  distinct ids its GPU ``instance_group`` entries list (:func:`pinned_gpus`), else the endpoint's.
- :meth:`TritonEndpoint.poll`: ModelReady per model, reachability (an
  answer to each ModelReady, else ServerLive), and load from the metrics
  (only the families read, :data:`METRICS_READ`, are parsed): queued = the larger of
  ``nv_inference_pending_request_count`` and TensorRT-LLM's ``waiting``
  requests; running = TensorRT-LLM's ``active`` requests, or ferry's batch
  runtime's ``ferry_batch_running_requests``; batch slots
  (``max_concurrency``) from the runtime's ``ferry_batch_max_concurrency``
  when it exports one (0 otherwise: the registered value stands); KV blocks
  ``free`` / ``max`` / ``tokens_per``; completed =
  ``nv_inference_request_success``; GPU utilization = mean of
  ``nv_gpu_utilization``; prefix blocks from the optional ``ferry_replica_*``
  counters; batch slots ``max_running`` from TensorRT-LLM's ``max`` requests;
  the engine's step counters (:mod:`agent.stepcounters`) when it exports
  them. TensorRT-LLM metrics are labelled with the engine's model (for
  example ``tensorrt_llm`` behind an ``ensemble``): when none carry the
  model's own name and the endpoint has exactly one engine, that one is used.
  Without a metrics URL, or when the scrape fails, ModelStatistics gives the
  completed count and the load reads zero (``source`` says which was used).

Every call has a timeout (``timeout_seconds``); with ``tls`` read from files the
client is a :class:`ferry.tls.Renewing` (a renewed certificate: a new channel
for the next call). An endpoint that does not answer ServerLive is reported
unreachable, never raised. Cost per poll: one
ModelReady per model (ServerLive only after a ModelReady got no answer),
one scrape parsed for :data:`METRICS_READ` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from agent import stepcounters
from agent.scrape import HttpError, Samples, get_text, parse
from ferry.grpcutil import channel_options
from ferry.tls import Renewing, TLSConfig

ModelKey = tuple[str, str]  # (name, version)
LLM_TENSORS = {"text_input", "max_tokens", "text_output"}
# ModelReady errors that are the endpoint's answer (it is reachable); any other error asks ServerLive.
ANSWERS = frozenset({"NOT_FOUND", "INVALID_ARGUMENT", "UNIMPLEMENTED", "FAILED_PRECONDITION"})
# The metric families :func:`from_metrics` reads; the scrape's other lines are skipped unparsed.
METRICS_READ = frozenset({
    "nv_inference_pending_request_count", "nv_trt_llm_request_metrics", "ferry_batch_running_requests",
    "ferry_batch_max_concurrency", "nv_trt_llm_kv_cache_block_metrics", "nv_inference_request_success",
    "ferry_replica_prefix_hit_blocks_total", "ferry_replica_prefix_lookup_blocks_total", "nv_gpu_utilization",
    *stepcounters.NAMES,
})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """An LLM model version found on an endpoint."""

    name: str
    version: str
    ready: bool
    max_batch_size: int = 0
    kv_block_tokens: int = 0
    max_context_tokens: int = 0
    gpus: int = 0  # the GPUs its instance groups pin (pinned_gpus); 0: none named, the endpoint's count
    # the input tensors its metadata and config declare (which sampling parameters it accepts); left out of
    # equality, which compares what the model is and holds
    inputs: tuple[str, ...] = dataclasses.field(default=(), compare=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelLoad:
    """One model version's load as last read."""

    ready: bool
    queued: int = 0
    running: int = 0
    kv_blocks_free: int = 0
    kv_blocks_total: int = 0
    kv_block_tokens: int = 0
    requests_total: int = 0
    prefix_hit_blocks: int = 0
    prefix_lookup_blocks: int = 0
    gpu_utilization: float = 0.0
    max_concurrency: int = 0  # batch slots the endpoint reports now (0: not reported)
    max_running: int = 0  # the engine's batch slots as its metrics state them (0: not stated)
    steps: stepcounters.Reading | None = None  # the engine's step counters (None: not exported)
    source: str = "metrics"  # metrics | statistics | none


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndpointLoad:
    """One poll of an endpoint: whether it answered, and each asked model's load."""

    reachable: bool
    models: Mapping[ModelKey, ModelLoad] = dataclasses.field(default_factory=dict)
    error: str = ""


class TritonEndpoint:
    """A KServe v2 endpoint at ``address`` (host:port) with an optional Prometheus ``metrics_url``."""

    def __init__(self, address: str, metrics_url: str | None = None, *, timeout_seconds: float = 1.0,
                 tls: TLSConfig | None = None) -> None:
        self.address, self.metrics_url, self.timeout = address, metrics_url, timeout_seconds
        # Reconnect within a second once a dead endpoint is back (gRPC's default backoff grows to 2 minutes).
        options = [*channel_options(), ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]

        def make() -> InferenceServerClient:  # mutual TLS to a replica that serves it, with the current pair
            return InferenceServerClient(address, channel_args=options,
                                         creds=tls.channel_credentials() if tls is not None else None)

        self._clients = Renewing(make, tls)
        self._session: aiohttp.ClientSession | None = None  # the scrapes' connections, made on first use

    async def close(self) -> None:
        await self._clients.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, call: Callable[[InferenceServerClient], Awaitable[Any]]) -> Any:
        """``call`` on the current client."""
        async with self._clients.use() as client:
            return await call(client)

    async def live(self) -> bool:
        """True when the endpoint answers ServerLive with live = true in time."""
        try:
            return bool(await self._call(lambda c: c.is_server_live(client_timeout=self.timeout)))
        except InferenceServerException:
            return False

    async def discover(self) -> list[ModelEntry]:
        """The LLM models of the endpoint's repository; raises InferenceServerException when it does not answer."""
        index = await self._call(lambda c: c.get_model_repository_index(client_timeout=self.timeout))
        found = await asyncio.gather(*(self._describe(m.name, m.version) for m in index.models))
        return [entry for entry in found if entry is not None]

    async def _describe(self, name: str, version: str) -> ModelEntry | None:
        try:
            meta = await self._call(lambda c: c.get_model_metadata(name, version, client_timeout=self.timeout))
            names = {t.name for t in meta.inputs} | {t.name for t in meta.outputs}
            if not names >= LLM_TENSORS:
                return None
            version = version or (meta.versions[0] if meta.versions else "")
            ready = await self._call(lambda c: c.is_model_ready(name, version, client_timeout=self.timeout))
            config = (await self._call(lambda c: c.get_model_config(name, version, client_timeout=self.timeout))).config
        except InferenceServerException:
            return None  # not loaded or not answering: seen again at the next discovery
        params = {k: v.string_value for k, v in config.parameters.items()}
        return ModelEntry(name=name, version=version, ready=bool(ready), max_batch_size=int(config.max_batch_size),
                          kv_block_tokens=_int(params.get("ferry_kv_block_tokens")),
                          max_context_tokens=_int(params.get("ferry_max_context_tokens")),
                          gpus=pinned_gpus(config),
                          inputs=tuple(dict.fromkeys([*(t.name for t in meta.inputs),
                                                      *(i.name for i in config.input)])))

    async def poll(self, models: Sequence[ModelKey]) -> EndpointLoad:
        """Reachability and the load of each of ``models``.

        ModelReady first: an answer to each shows the endpoint reachable, so ServerLive is asked only
        when one got no answer (or no model is asked): one call per model per poll, not one more.
        """
        answers = await asyncio.gather(*(self._ready(name, version) for name, version in models))
        if (not models or None in answers) and not await self.live():
            return EndpointLoad(reachable=False, error=f"{self.address} does not answer ServerLive")
        ready = [bool(answer) for answer in answers]
        samples, error = None, ""
        if self.metrics_url:
            try:
                if self._session is None:
                    self._session = aiohttp.ClientSession()
                text = await get_text(self.metrics_url, session=self._session, timeout_seconds=self.timeout)
                samples = Samples(parse(text, names=METRICS_READ))
            except HttpError as exc:
                error = str(exc)
        loads: dict[ModelKey, ModelLoad] = {}
        for key, is_ready in zip(models, ready, strict=True):
            if samples is not None:
                loads[key] = from_metrics(samples, key[0], key[1], ready=is_ready)
            else:
                loads[key] = await self._from_statistics(key[0], key[1], ready=is_ready)
        return EndpointLoad(reachable=True, models=loads, error=error)

    async def _ready(self, name: str, version: str) -> bool | None:
        """ModelReady's answer; False for an error status (an unknown model), None when there was no answer."""
        try:
            return bool(await self._call(lambda c: c.is_model_ready(name, version, client_timeout=self.timeout)))
        except InferenceServerException as exc:
            return False if (exc.status() or "").rpartition(".")[2] in ANSWERS else None

    async def _from_statistics(self, name: str, version: str, *, ready: bool) -> ModelLoad:
        try:
            stats: Any = await self._call(
                lambda c: c.get_inference_statistics(name, version, client_timeout=self.timeout))
        except InferenceServerException:
            return ModelLoad(ready=ready, source="none")
        total = sum(int(s.inference_stats.success.count) for s in stats.model_stats)
        return ModelLoad(ready=ready, requests_total=total, source="statistics")


def from_metrics(samples: Samples, model: str, version: str, *, ready: bool) -> ModelLoad:
    """A model's load from scraped Triton / TensorRT-LLM metrics (pure)."""
    labels = {"model": model, "version": version}
    trt = labels
    if samples.get("nv_trt_llm_request_metrics", **labels) is None:
        engines = _engines(samples)
        if len(engines) == 1:
            engine_model, engine_version = next(iter(engines))
            trt = {"model": engine_model, "version": engine_version}

    def value(name: str, lab: Mapping[str, str], **extra: str) -> float:
        return samples.get(name, **lab, **extra) or 0.0

    pending = value("nv_inference_pending_request_count", labels)
    waiting = value("nv_trt_llm_request_metrics", trt, request_type="waiting")
    return ModelLoad(
        ready=ready,
        queued=int(max(pending, waiting)),
        running=int(max(value("nv_trt_llm_request_metrics", trt, request_type="active"),
                        value("ferry_batch_running_requests", labels))),
        max_concurrency=int(value("ferry_batch_max_concurrency", labels)),
        kv_blocks_free=int(value("nv_trt_llm_kv_cache_block_metrics", trt, kv_cache_block_type="free")),
        kv_blocks_total=int(value("nv_trt_llm_kv_cache_block_metrics", trt, kv_cache_block_type="max")),
        kv_block_tokens=int(value("nv_trt_llm_kv_cache_block_metrics", trt, kv_cache_block_type="tokens_per")),
        requests_total=int(value("nv_inference_request_success", labels)),
        prefix_hit_blocks=int(value("ferry_replica_prefix_hit_blocks_total", labels)),
        prefix_lookup_blocks=int(value("ferry_replica_prefix_lookup_blocks_total", labels)),
        gpu_utilization=min(1.0, max(0.0, samples.mean("nv_gpu_utilization") or 0.0)),
        max_running=int(value("nv_trt_llm_request_metrics", trt, request_type="max")),
        steps=stepcounters.read(lambda name: samples.get(name, **labels)),
    )


def _engines(samples: Samples) -> set[tuple[str, str]]:
    return {(s.labels.get("model", ""), s.labels.get("version", "")) for s in samples.all("nv_trt_llm_request_metrics")}


def pinned_gpus(config: mc.ModelConfig) -> int:
    """The GPUs a model's config pins: the distinct ids listed by its GPU instance groups (``kind`` KIND_GPU, or
    KIND_AUTO with ``gpus`` given, as ``instance_group [{ kind: KIND_GPU, gpus: [0] }]``); 0 when none lists any:
    Triton then puts instances on every GPU it sees, or the backend places itself (TensorRT-LLM's KIND_CPU or
    KIND_MODEL groups), and the model holds the endpoint's GPUs."""
    gpu_kinds = (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO)
    return len({gpu for group in config.instance_group if group.kind in gpu_kinds for gpu in group.gpus})


def _int(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0
