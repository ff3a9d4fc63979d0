"""N standalone simulated replicas in one process, each with its gRPC, HTTP and metrics endpoints on loopback.

The peer routers are measured in front of the replicas Ferry routes to:
each :class:`agent.replica.server.SimulatedReplica` here serves KServe v2 gRPC (for
Ferry), the HTTP face of :mod:`tools.peers.replicaface` (SGLang ``/generate``, OpenAI
``/v1/completions``, for the peer routers) and Prometheus text, all on one
engine, so a request costs the same whichever way it arrives.

Usage::

    python -m tools.peers.replicas --count 8 --model chat --ready-file /tmp/replicas.json \\
        [--engine max_running=60 --engine decode_base_seconds=0.008 ...] [--host 127.0.0.1]

Once every replica serves, the ready file is written atomically
(:func:`ferry.process.write_ready_file`)::

    {"pid": 123, "model": "chat", "replicas": [{"id": "r0", "grpc": "127.0.0.1:P",
     "http": "http://127.0.0.1:Q", "metrics": "http://127.0.0.1:R/metrics"}, ...]}

The process stops cleanly (engines, then listeners) on SIGTERM or SIGINT.
``--engine KEY=VALUE`` sets a field of :class:`agent.replica.engine.EngineParams`
(the fleet simulator's parser, :func:`tools.simulate.engine_params`);
defaults are the engine's (one large-model replica). ``--count`` is 1 to
``MAX_COUNT``. :func:`start_replicas` starts the same set inside a running
event loop (for tests).

Cost: per replica one engine task and three listening sockets; an idle
replica costs no CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from agent.replica.engine import EngineParams
from agent.replica.server import SimulatedReplica
from ferry.errors import ConfigError
from ferry.process import stop_event, write_ready_file
from tools.peers.replicaface import HttpFace

MAX_COUNT = 256


async def start_replicas(count: int, model: str, params: EngineParams | None = None,
                         host: str = "127.0.0.1") -> list[SimulatedReplica]:
    """Start ``count`` replicas with their HTTP faces (ids r0, r1, ...); on a failure, those started are stopped."""
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count must be 1..{MAX_COUNT}, got {count}")
    started: list[SimulatedReplica] = []
    try:
        for i in range(count):
            started.append(await SimulatedReplica(model, params=params, host=host, replica_id=f"r{i}",
                                                  face=HttpFace).start())
    except BaseException:
        await stop_replicas(started)
        raise
    return started


async def stop_replicas(replicas: list[SimulatedReplica]) -> None:
    """Stop every replica (in-flight requests are cancelled)."""
    await asyncio.gather(*(r.stop(grace=0.2) for r in replicas), return_exceptions=True)


def describe(replicas: list[SimulatedReplica], model: str) -> dict[str, Any]:
    """The ready file's payload."""
    return {"pid": os.getpid(), "model": model, "replicas": [
        {"id": r.replica_id, "grpc": r.address, "http": r.http_url, "metrics": r.metrics_url} for r in replicas]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.peers.replicas",
                                description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--count", type=int, default=8, help=f"replicas, 1..{MAX_COUNT} (default 8)")
    p.add_argument("--model", default="chat", help="model name every replica serves (default chat)")
    p.add_argument("--ready-file", default=None, help="JSON written atomically once every replica serves")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                   help="engine parameter (agent.replica.engine.EngineParams), repeatable")
    args = p.parse_args(argv)
    if not 1 <= args.count <= MAX_COUNT:
        p.error(f"--count: must be 1..{MAX_COUNT}, got {args.count}")
    return args


async def serve(args: argparse.Namespace, params: EngineParams) -> None:
    stop = stop_event()
    replicas = await start_replicas(args.count, args.model, params, args.host)
    try:
        write_ready_file(args.ready_file, describe(replicas, args.model))
        await stop.wait()
    finally:
        await stop_replicas(replicas)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tools.simulate import engine_params  # the fleet simulator's KEY=VALUE parser (imports its plotting)

    for item in args.engine:  # one at a time first, so that a bad value is named
        try:
            engine_params([item])
        except (ConfigError, ValueError) as exc:
            raise SystemExit(f"--engine {item}: {exc}") from None
    try:
        params = engine_params(args.engine)
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"--engine: {exc}") from None
    asyncio.run(serve(args, params))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
