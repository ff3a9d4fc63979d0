"""``ferry node``: one node's simulated replicas and its agent, in one process.

Each ``--replica MODEL[:VERSION]`` starts a :class:`agent.replica.server.SimulatedReplica`
(id ``{node}-r{i}``, version ``v1`` by default, engine parameters from the
``[replica]`` section, the node's GPUs shared evenly); ``--triton`` also adopts
every LLM model of a real Triton endpoint. ``--batch-runtime`` also runs
ferry's fixed-batch runtime (:mod:`agent.batch`) on the node's ``--gpus``,
hosting ``--batch-model`` (and ``--batch-gang-model``, which needs every GPU
per batch) with the contract flags of ``ferry batch-runtime`` prefixed
``batch-`` (:mod:`agent.batch.host`); each hosted model is a replica
``{node}-b{j}`` registered with GPUs = its GPUs per batch and
max_concurrency = 2 × ``max_batch`` × batch slots (one batch running, one filling). The agent reaches every
replica over gRPC, as it would on a real node, and connects to the control
planes; a GPU killed or restored in the runtime makes it poll at once, so a
gang model that lost a GPU leaves the table within one telemetry round trip.
Once everything serves, the ready file gets
``{"node", "pid", "metrics", "replicas": [{"replica_id", "model", "version", "address", "metrics", "http"}]}``
(``http``: the HTTP face's ``host:port``, when it serves one)
and, with the batch runtime, ``"batch_runtime": {"address", "metrics", "models"}``.
SIGUSR1 toggles a tenfold slowdown of every simulated replica of the node
(fault injection for the outlier tests: each engine step takes 10x longer).
Given a ``face`` (:class:`agent.replica.server.FaceFactory`; the ``ferry``
command gives ``ferry node`` the HTTP face of ``tools.peers.replicaface``:
OpenAI ``/v1/completions`` and ``/v1/chat/completions``, SGLang ``/generate``),
every simulated replica also serves it and registers its ``host:port`` as
``http_address`` (engine ``simulated``), so a proxy in front of HTTP can forward
OpenAI requests to it untouched; ``--no-http`` turns the faces off, and so does
mutual TLS (the face serves plain text only). Without a face (``main`` called
with none) the replicas serve gRPC and metrics only.
``--openai URL`` (repeatable) registers an engine that serves OpenAI HTTP
itself (:mod:`agent.openai`): ``--engine`` ``vllm``, ``sglang`` or ``trtllm``,
``--metrics URL`` its Prometheus endpoint, ``--openai-model NAME`` the model
it serves (else read from its ``/v1/models``); each of the three is given once
for every ``--openai`` or once per ``--openai`` in the same order. Its replicas
(id ``{node}-o{i}-{model}-v1``) have the URL's ``host:port`` as
``http_address`` and no KServe ``address``; ``/health`` says whether they are ready.
``--join-token`` (env ``FERRY_JOIN_TOKEN``) is presented on registration.
``--standby`` registers the node with no replica and ``Register.standby``
set: warm hardware in the region's warm pool, never routed to (no table lists
a node without replicas), counted by the control plane's scaling plan
(:mod:`controlplane.scaling`); it excludes ``--replica``, ``--triton``, ``--openai`` and
``--batch-runtime`` (the warm pool is hardware, not weights).
``--tls-ca``/``--tls-cert``/``--tls-key`` give mutual TLS to the control
planes, and the replicas and batch runtime serve mutual TLS with the same
certificate (an adopted ``--triton`` endpoint stays plain text); else
``--insecure``; one of them is required.
Stops cleanly on SIGTERM and SIGINT. Exit status: 0 after a clean stop, 2 for
bad flags or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys

from agent.agent import Agent, Endpoint, NodeInfo
from agent.batch.host import HostedRuntime, RuntimeSpec, add_arguments, spec_from_args
from agent.batch.runtime import BATCHES_IN_FLIGHT
from agent.config import AgentSettings
from agent.inventory import ReplicaSpec
from agent.openai import ENGINES, http_address
from agent.replica.engine import EngineParams
from agent.replica.server import FaceFactory, SimulatedReplica
from agent.replica.tensors import DECLARED
from ferry import logs, tls
from ferry.config import load_file
from ferry.errors import ConfigError
from ferry.grpcutil import split_address
from ferry.metrics import start_metrics_server
from ferry.process import stop_event, write_ready_file
from ferry.tokens import Tokenizers

BATCH_PREFIX = "batch-"
JOIN_ENV = "FERRY_JOIN_TOKEN"
SLOWDOWN = 10.0  # SIGUSR1: engine steps take this many times longer, until the next SIGUSR1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry node", description="A node: its agent and simulated replicas.")
    parser.add_argument("--control-plane", default=os.environ.get("FERRY_CONTROL_PLANE", ""),
                        metavar="HOST:PORT[,HOST:PORT...]",
                        help="control plane addresses, tried in turn (env FERRY_CONTROL_PLANE)")
    parser.add_argument("--region", default=os.environ.get("FERRY_REGION", "local"),
                        help="the node's region (env FERRY_REGION, default local)")
    parser.add_argument("--node", default=f"{socket.gethostname()}-{os.getpid()}", help="node name (default host-pid)")
    parser.add_argument("--replica", action="append", default=[], metavar="MODEL[:VERSION]",
                        help="run one simulated replica of MODEL (version v1 by default); repeatable")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs on the node (default 8)")
    parser.add_argument("--standby", action="store_true",
                        help="register as a standby node: warm hardware, no replica, no weights loaded")
    parser.add_argument("--warmup-seconds", type=float, default=0.0,
                        help="simulated replicas load their model this long before they are ready (default 0)")
    parser.add_argument("--triton", metavar="ADDRESS", help="also adopt the LLM models of this KServe v2 endpoint")
    parser.add_argument("--triton-metrics", metavar="URL", help="that endpoint's Prometheus URL (optional)")
    parser.add_argument("--triton-openai", metavar="URL",
                        help="that server's OpenAI-compatible front end (http://HOST:PORT, optional): each adopted "
                             "replica is also reached there, straight through Envoy")
    parser.add_argument("--no-http", action="store_true",
                        help="do not serve the simulated replicas' OpenAI/SGLang HTTP faces")
    openai = parser.add_argument_group("OpenAI-HTTP engines", "engines that serve OpenAI HTTP themselves")
    openai.add_argument("--openai", action="append", default=[], metavar="URL",
                        help="register the models of the engine at this http://HOST:PORT; repeatable")
    openai.add_argument("--metrics", "--openai-metrics", dest="openai_metrics", action="append", default=[],
                        metavar="URL", help="its Prometheus metrics URL (once, or once per --openai)")
    openai.add_argument("--engine", action="append", default=[], choices=ENGINES,
                        help="its engine (once, or once per --openai)")
    openai.add_argument("--openai-model", action="append", default=[], metavar="NAME",
                        help="the model it serves (once, or once per --openai; default: its /v1/models)")
    parser.add_argument("--config", metavar="PATH", help="TOML config file (sections [agent] and [replica])")
    logs.add_argument(parser)
    parser.add_argument("--listen-host", default="127.0.0.1", help="host the replicas bind (default 127.0.0.1)")
    parser.add_argument("--metrics-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="the agent's own metrics endpoint (default 127.0.0.1:0)")
    parser.add_argument("--ready-file", metavar="PATH", help="write the bound addresses here once serving")
    parser.add_argument("--join-token", default=os.environ.get(JOIN_ENV, ""), metavar="TOKEN",
                        help=f"the control plane's join token (env {JOIN_ENV}); not needed with a certificate "
                             "of common name agent")
    tls.add_arguments(parser)
    batch = parser.add_argument_group("batch runtime", "ferry's fixed-batch runtime on this node's GPUs")
    batch.add_argument("--batch-runtime", action="store_true", help="run the batch runtime and register its models")
    add_arguments(batch, prefix=BATCH_PREFIX, version="v1")
    return parser


def parse_replica(text: str) -> tuple[str, str]:
    """``MODEL[:VERSION]`` to (model, version), version ``v1`` by default."""
    model, _, version = text.partition(":")
    if not model.strip():
        raise ValueError(f"--replica {text!r}: expected MODEL[:VERSION]")
    return model.strip(), version.strip() or "v1"


def _per_endpoint(values: list[str], count: int, flag: str) -> list[str]:
    """One value per ``--openai``: given once for all, or once each."""
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise ValueError(f"{flag}: give it once, or once per --openai ({count}), not {len(values)} times")
    return values


def openai_endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """The ``--openai`` engines as agent endpoints; raises ValueError for flags that do not fit."""
    urls = list(args.openai)
    if not urls:
        if args.openai_metrics or args.engine or args.openai_model:
            raise ValueError("--metrics, --engine and --openai-model go with --openai")
        return []
    if not args.engine:
        raise ValueError(f"--openai needs --engine ({', '.join(ENGINES)})")
    engines = _per_endpoint(args.engine, len(urls), "--engine")
    metrics: list[str | None] = [*_per_endpoint(args.openai_metrics, len(urls), "--metrics")] \
        if args.openai_metrics else [None] * len(urls)
    models = _per_endpoint(args.openai_model, len(urls), "--openai-model") if args.openai_model else [""] * len(urls)
    endpoints = []
    for url, engine, metrics_url, model in zip(urls, engines, metrics, models, strict=True):
        http_address(url)  # raises ValueError for a URL that is not http://HOST[:PORT]
        if metrics_url is not None and not metrics_url.startswith("http://"):
            raise ValueError(f"--metrics {metrics_url!r}: expected an http:// URL")
        endpoints.append(Endpoint(openai_url=url.rstrip("/"), metrics_url=metrics_url, engine=engine, adopt=True,
                                  gpus=args.gpus, openai_models=(model,) if model else ()))
    return endpoints


def main(argv: list[str] | None = None, *, face: FaceFactory | None = None) -> int:
    """``ferry node`` with ``argv``; ``face``: the simulated replicas' face beside gRPC (None: none)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(logging.INFO, args.log_format)
    try:
        control_planes = [a.strip() for a in args.control_plane.split(",") if a.strip()]
        if not control_planes:
            raise ValueError("--control-plane (or FERRY_CONTROL_PLANE) is required")
        for address in control_planes:
            split_address(address)
        split_address(args.metrics_listen)
        replicas = [parse_replica(r) for r in args.replica]
        if args.gpus < 1:
            raise ValueError("--gpus must be >= 1")
        args.openai_endpoints = openai_endpoints(args)
        if args.triton_openai:
            if not args.triton:
                raise ValueError("--triton-openai goes with --triton")
            http_address(args.triton_openai)  # a bad URL fails here, naming the flag's value
        if args.standby and (replicas or args.triton or args.batch_runtime or args.openai):
            raise ValueError("--standby: a standby node loads no weights; it excludes --replica, --triton, "
                             "--openai and --batch-runtime")
        if not 0 <= args.warmup_seconds <= 3600:
            raise ValueError("--warmup-seconds must be in [0, 3600]")
        cfg = load_file(args.config)
        params = cfg.section(EngineParams, "replica")
        try:  # each model's tokenizer file, so that replicas count and cut prompts as the proxy does
            args.tokenizers = Tokenizers.load((m.name, m.tokenizer) for m in cfg.models)
        except ValueError as exc:
            raise ConfigError("models.tokenizer", str(exc)) from exc
        settings = cfg.section(AgentSettings, "agent")
        batch = spec_from_args(args, gpus=args.gpus, prefix=BATCH_PREFIX) if args.batch_runtime else None
        args.transport = tls.from_args(args)
    except (ValueError, ConfigError) as exc:
        print(f"ferry node: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, control_planes, replicas, params, settings, batch, face=face))
    except ConfigError as exc:  # the batch function could not be loaded
        print(f"ferry node: {exc}", file=sys.stderr)
        return 2
    return 0


def batch_endpoint(node: str, hosted: HostedRuntime, spec: RuntimeSpec) -> Endpoint:
    """The batch runtime as an endpoint of the agent: one replica per hosted model."""
    node_dispatch = hosted.runtime.node
    replicas = tuple(ReplicaSpec(
        replica_id=f"{node}-b{j}", model=c.name, version=spec.version, address=hosted.address, kserve_model=c.name,
        gpus=c.gpus_per_batch,
        max_concurrency=BATCHES_IN_FLIGHT * c.max_batch * max(1, node_dispatch.slots(c.name)))
        for j, c in enumerate(node_dispatch.contracts.values()))
    return Endpoint(address=hosted.address, metrics_url=hosted.metrics_url, replicas=replicas, gpus=spec.gpus)


def watch_slowdown(replicas: list[SimulatedReplica]) -> None:
    """SIGUSR1 toggles a ``SLOWDOWN``-fold (10x) slowdown of every simulated replica of the node (fault injection)."""

    def toggle() -> None:
        runners = [r.runner for r in replicas if r.runner is not None]
        for runner in runners:
            runner.slowdown = 1.0 if runner.slowdown != 1.0 else SLOWDOWN
        logging.getLogger(__name__).warning("simulated replicas slowed down %gx",
                                            runners[0].slowdown if runners else 1.0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, toggle)


async def serve(args: argparse.Namespace, control_planes: list[str], models: list[tuple[str, str]],
                params: EngineParams, settings: AgentSettings, batch: RuntimeSpec | None = None, *,
                face: FaceFactory | None = None) -> None:
    """Run the replicas (with ``face`` beside gRPC), the batch runtime and the agent until SIGTERM or SIGINT."""
    stop = stop_event()
    replicas: list[SimulatedReplica] = []
    agent: Agent | None = None
    hosted: HostedRuntime | None = None
    gpus_each = max(1, args.gpus // max(1, len(models)))
    # The HTTP face serves plain text only: with mutual TLS it stays off (its requests would bypass the certificate).
    http = face is not None and not getattr(args, "no_http", False) and args.transport is None

    def batch_changed() -> None:
        if agent is not None:
            agent.poll_now()

    try:
        if batch is not None:
            hosted = await HostedRuntime.start(batch, host=args.listen_host, on_change=batch_changed,
                                               tls=args.transport)
        for i, (model, version) in enumerate(models):
            replica = SimulatedReplica(model, version, params=params, host=args.listen_host,
                                       replica_id=f"{args.node}-r{i}", tls=args.transport,
                                       warmup_seconds=args.warmup_seconds, face=face if http else None,
                                       tokenizer=getattr(args, "tokenizers", Tokenizers()).get(model))
            replicas.append(replica)
            await replica.start()
        endpoints = [Endpoint(address=r.address, metrics_url=r.metrics_url, gpus=gpus_each, replicas=(ReplicaSpec(
            replica_id=r.replica_id, model=r.model, version=r.version, address=r.address, kserve_model=r.model,
            gpus=gpus_each, max_concurrency=params.max_running, kv_block_tokens=params.kv_block_tokens,
            max_context_tokens=params.max_context_tokens, inputs=tuple(DECLARED), engine="simulated",
            http_address=f"{r.host}:{r.http_port}" if r.http else ""),), tls=r.tls is not None)
            for r in replicas]
        batch_replicas: tuple[ReplicaSpec, ...] = ()
        if hosted is not None and batch is not None:
            endpoint = batch_endpoint(args.node, hosted, batch)
            endpoints.append(dataclasses.replace(endpoint, tls=args.transport is not None))
            batch_replicas = endpoints[-1].replicas
        if args.triton:
            endpoints.append(Endpoint(address=args.triton, metrics_url=args.triton_metrics, adopt=True, gpus=args.gpus,
                                      http_address=http_address(args.triton_openai) if args.triton_openai else ""))
        endpoints += getattr(args, "openai_endpoints", [])
        metrics_host, _ = split_address(args.metrics_listen)
        metrics_port = start_metrics_server(args.metrics_listen)
        agent = Agent(node=NodeInfo(node=args.node, region=args.region, gpus=args.gpus, standby=args.standby),
                      control_planes=control_planes, endpoints=endpoints, settings=settings,
                      tls=args.transport, join_token=args.join_token)
        await agent.start()
        listed = [{"replica_id": r.replica_id, "model": r.model, "version": r.version,
                   "address": r.address, "metrics": r.metrics_address,
                   **({"http": f"{r.host}:{r.http_port}"} if r.http else {})} for r in replicas]
        ready: dict[str, object] = {"node": args.node, "pid": os.getpid(), "metrics": f"{metrics_host}:{metrics_port}"}
        if hosted is not None:
            listed += [{"replica_id": r.replica_id, "model": r.model, "version": r.version, "address": r.address,
                        "metrics": hosted.metrics_address} for r in batch_replicas]
            ready["batch_runtime"] = {"address": hosted.address, "metrics": hosted.metrics_address,
                                      "models": hosted.runtime.models}
        watch_slowdown(replicas)
        write_ready_file(args.ready_file, {**ready, "replicas": listed})
        logging.getLogger(__name__).info("node %s serving %d replicas", args.node, len(listed))
        await stop.wait()
    finally:
        if agent is not None:
            await agent.stop()
        for replica in replicas:
            await replica.stop()
        if hosted is not None:
            await hosted.stop()
