"""The agent's adapter to an engine that serves OpenAI HTTP itself (vLLM, SGLang, TensorRT-LLM's server).

Such a replica is reached over OpenAI HTTP alone: it registers an
``http_address`` (``host:port`` of its base URL) and no KServe ``address``,
and an HTTP proxy in front of the fleet forwards requests to it untouched. Over
HTTP with aiohttp, every call bounded by ``timeout_seconds`` and every body
by ``MAX_BODY_BYTES``:

- :meth:`OpenAIEndpoint.discover`: ``GET /v1/models``: one
  :class:`agent.triton.ModelEntry` per model id listed (version ``v1``, at
  most ``MAX_MODELS``), or the names given (``--openai-model``) without
  asking.
- :meth:`OpenAIEndpoint.poll`: ``GET /health`` (200: reachable and ready;
  another status: reachable, not ready; no answer: unreachable), then one
  scrape of the engine's own Prometheus metrics, parsed with
  ``prometheus_client.parser.text_string_to_metric_families`` and read by
  :func:`load_from_metrics` (pure). A scrape that fails or does not parse
  leaves the load at zero and says why in ``EndpointLoad.error``.

Metric names per engine (:data:`ENGINE_METRICS`; the first name present wins,
samples are summed over the ranks of a server and filtered on ``model_name``
when they carry the model's):

- ``vllm`` (https://docs.vllm.ai/en/stable/usage/metrics/): running =
  ``vllm:num_requests_running``, queued = ``vllm:num_requests_waiting``, KV
  use = ``vllm:kv_cache_usage_perc`` (older releases:
  ``vllm:gpu_cache_usage_perc``), a fraction 0..1; blocks and block size from
  ``vllm:cache_config_info{num_gpu_blocks, block_size}`` when exported;
  completed = ``vllm:request_success_total``.
- ``sglang`` (https://docs.sglang.io/references/production_metrics.html,
  served with ``--enable-metrics``): running = ``sglang:num_running_reqs``,
  queued = ``sglang:num_queue_reqs``, KV use = ``sglang:token_usage``
  (fraction of the KV token pool in use); completed =
  ``sglang:num_requests_total``.
- ``trtllm``: as :func:`agent.triton.from_metrics` reads TensorRT-LLM's
  Triton backend metrics (``nv_trt_llm_request_metrics{request_type=active|waiting}``,
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=free|max|tokens_per}``),
  summed over every model label.

Every engine: its step counters (:mod:`agent.stepcounters`) when it exports
them (a ferry simulated replica does, under any of the three names).

A KV use fraction becomes blocks: ``kv_blocks_total`` is the engine's block
count when it exports one, else ``KV_FRACTION_BLOCKS`` (1000) nominal blocks,
and ``kv_blocks_free`` = round((1 - use) x total).

Cost per poll: two HTTP GETs; O(scrape) to parse (the whole text: the
parser reads every family).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent import stepcounters
from agent.scrape import MAX_BODY_BYTES, HttpError, fetch
from agent.triton import EndpointLoad, ModelEntry, ModelKey, ModelLoad

ENGINES = ("vllm", "sglang", "trtllm")  # the engines an OpenAI-HTTP endpoint may name (ReplicaInfo.engine)
OPENAI_VERSION = "v1"  # the version an OpenAI-HTTP replica registers (the API names no version)
KV_FRACTION_BLOCKS = 1000  # nominal blocks of an engine that exports only a KV use fraction
MAX_MODELS = 16  # model ids read from one /v1/models


@dataclasses.dataclass(frozen=True)
class EngineMetrics:
    """The metric names (sample names, first present wins) one engine's load is read from."""

    running: tuple[str, ...]
    queued: tuple[str, ...]
    kv_use: tuple[str, ...]  # a fraction 0..1 of the KV cache in use
    completed: tuple[str, ...] = ()


ENGINE_METRICS = {
    "vllm": EngineMetrics(running=("vllm:num_requests_running",), queued=("vllm:num_requests_waiting",),
                          kv_use=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                          completed=("vllm:request_success_total",)),
    "sglang": EngineMetrics(running=("sglang:num_running_reqs",), queued=("sglang:num_queue_reqs",),
                            kv_use=("sglang:token_usage",), completed=("sglang:num_requests_total",)),
}


class _Samples:
    """The samples of one scrape by sample name, optionally narrowed to a ``model_name``."""

    def __init__(self, text: str, model: str) -> None:
        self.by_name: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.by_name.setdefault(sample.name, []).append(sample)
                if family.type == "counter" and sample.name == f"{family.name}_total":
                    # the parser names a counter's samples ``_total``, also those exported without it
                    self.by_name.setdefault(family.name, []).append(sample)
        self.model = model

    def rows(self, name: str) -> list[Sample]:
        """The samples of ``name``: those labelled with the model's name when any is, else all."""
        found = self.by_name.get(name, [])
        own = [s for s in found if s.labels.get("model_name") == self.model]
        return own or found

    def total(self, names: Iterable[str], **labels: str) -> float | None:
        """The sum over the first of ``names`` with samples (matching ``labels``); None when none has any."""
        for name in names:
            rows = [s for s in self.rows(name) if all(s.labels.get(k) == v for k, v in labels.items())]
            if rows:
                return float(sum(s.value for s in rows))
        return None


def load_from_metrics(text: str, engine: str, model: str, *, ready: bool) -> ModelLoad:
    """``model``'s load from the Prometheus text of a ``engine`` server (pure); raises ValueError when the text
    does not parse or the engine is unknown."""
    samples = _Samples(text, model)
    if engine == "trtllm":
        return _trtllm(samples, ready=ready)
    names = ENGINE_METRICS.get(engine)
    if names is None:
        raise ValueError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    use = min(1.0, max(0.0, samples.total(names.kv_use) or 0.0))
    total, block_tokens = KV_FRACTION_BLOCKS, 0
    if engine == "vllm":
        info = samples.rows("vllm:cache_config_info")
        if info:
            total = _int(info[0].labels.get("num_gpu_blocks")) or KV_FRACTION_BLOCKS
            block_tokens = _int(info[0].labels.get("block_size"))
    return ModelLoad(
        ready=ready,
        queued=int(samples.total(names.queued) or 0),
        running=int(samples.total(names.running) or 0),
        kv_blocks_total=total,
        kv_blocks_free=round((1.0 - use) * total),
        kv_block_tokens=block_tokens,
        requests_total=int(samples.total(names.completed) or 0),
        steps=_steps(samples),
    )


def _steps(samples: _Samples) -> stepcounters.Reading | None:
    return stepcounters.read(lambda name: samples.total((name,)))


def _trtllm(samples: _Samples, *, ready: bool) -> ModelLoad:
    """TensorRT-LLM's Triton-backend names (as :func:`agent.triton.from_metrics`), over every model label."""
    request, blocks = ("nv_trt_llm_request_metrics",), ("nv_trt_llm_kv_cache_block_metrics",)
    return ModelLoad(
        ready=ready,
        queued=int(samples.total(request, request_type="waiting") or 0),
        running=int(samples.total(request, request_type="active") or 0),
        kv_blocks_free=int(samples.total(blocks, kv_cache_block_type="free") or 0),
        kv_blocks_total=int(samples.total(blocks, kv_cache_block_type="max") or 0),
        kv_block_tokens=int(samples.total(blocks, kv_cache_block_type="tokens_per") or 0),
        requests_total=int(samples.total(("nv_inference_request_success",)) or 0),
        max_running=int(samples.total(request, request_type="max") or 0),
        steps=_steps(samples),
    )


def http_address(url: str) -> str:
    """``host:port`` of an ``http://`` base URL (port 80 when it names none); raises ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r}: expected http://HOST[:PORT]")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or 80}"


class OpenAIEndpoint:
    """An OpenAI-HTTP server at ``url`` (``http://host:port``) of ``engine``, with its Prometheus ``metrics_url``."""

    def __init__(self, url: str, metrics_url: str | None, *, engine: str, timeout_seconds: float = 1.0,
                 models: Sequence[str] = ()) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
        self.address = http_address(url)
        self.base = f"http://{self.address}"
        self.metrics_url, self.engine, self.timeout = metrics_url, engine, timeout_seconds
        self.names = tuple(models)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made in the running loop, on first use
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def _get(self, url: str) -> tuple[int, str]:
        """(status, body) of ``GET url``; raises HttpError when there is no answer in time or it is too large."""
        return await fetch(self._client(), url, max_bytes=MAX_BODY_BYTES)

    async def discover(self) -> list[ModelEntry]:
        """The models the server serves (the names given, else ``/v1/models``); raises HttpError without an answer."""
        names = list(self.names)
        if not names:
            status, body = await self._get(f"{self.base}/v1/models")
            if status != 200:
                raise HttpError(f"{self.base}/v1/models: HTTP {status}")
            names = _model_ids(body)
        return [ModelEntry(name=name, version=OPENAI_VERSION, ready=True) for name in names[:MAX_MODELS]]

    async def poll(self, models: Sequence[ModelKey]) -> EndpointLoad:
        """Reachability (``/health``) and the load of each of ``models`` (the server's metrics)."""
        try:
            status, _ = await self._get(f"{self.base}/health")
        except HttpError as exc:
            return EndpointLoad(reachable=False, error=str(exc))
        ready, text, error = status == 200, None, ""
        if self.metrics_url:
            try:
                scraped, text = await self._get(self.metrics_url)
                if scraped != 200:
                    text, error = None, f"{self.metrics_url}: HTTP {scraped}"
            except HttpError as exc:
                error = str(exc)
        loads: dict[ModelKey, ModelLoad] = {}
        for key in models:
            load = ModelLoad(ready=ready, source="none")
            if text is not None:
                try:
                    load = load_from_metrics(text, self.engine, key[0], ready=ready)
                except ValueError as exc:  # the parser's error for a malformed exposition
                    error = f"{self.metrics_url}: {exc}"
            loads[key] = load
        return EndpointLoad(reachable=True, models=loads, error=error)


def _model_ids(body: str) -> list[str]:
    """The ``data[].id`` of an OpenAI model list; raises HttpError when it is not one."""
    try:
        listed = json.loads(body)
        ids = [str(m["id"]) for m in listed["data"] if isinstance(m, dict) and m.get("id")]
    except (ValueError, KeyError, TypeError) as exc:
        raise HttpError(f"/v1/models: not an OpenAI model list ({exc})") from exc
    return list(dict.fromkeys(ids))


def _int(text: str | None) -> int:
    try:
        return int(float(text)) if text else 0
    except ValueError:
        return 0
