"""A stand-in for the Triton container of the example GPU pod: one simulated replica (KServe v2 gRPC).

``python -m tests.deploy.standin MODEL --ready-file PATH`` serves MODEL
(version v1) with a fast engine on 127.0.0.1 and writes ``{"pid",
"address", "metrics_url"}`` once it serves; the agent sidecar adopts it
through ``--triton`` as it would a Triton server. ``--pin-gpus N``: its
model config pins GPUs 0 to N-1 (``instance_group [{kind: KIND_GPU, gpus:
[0, ...]}]``), as a Triton repository's ``config.pbtxt`` does. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from agent.replica import server
from agent.replica.engine import EngineParams
from agent.replica.server import ReplicaServicer, SimulatedReplica
from ferry.process import die_with_parent, stop_event, write_ready_file
from tools.process_fleet import FAST_REPLICA


def pinning(gpus: int) -> type[ReplicaServicer]:
    """The replica's servicer, its ModelConfig listing one instance group on GPUs 0 to ``gpus`` - 1."""

    class Pinned(ReplicaServicer):
        async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
            answer = await super().ModelConfig(request, context)
            group = mc.ModelInstanceGroup
            answer.config.instance_group.append(group(kind=group.KIND_GPU, count=1, gpus=list(range(gpus))))
            return answer

    return Pinned


async def serve(model: str, ready_file: str, pin_gpus: int = 0) -> None:
    """Serve one simulated replica of ``model`` until SIGTERM (its config pinning ``pin_gpus`` GPUs, if any)."""
    if pin_gpus:
        server.ReplicaServicer = pinning(pin_gpus)  # this process serves that one replica
    stop = stop_event()
    async with SimulatedReplica(model, "v1", params=EngineParams(**FAST_REPLICA)) as replica:
        write_ready_file(ready_file, {"pid": os.getpid(), "address": replica.address,
                                      "metrics_url": replica.metrics_url})
        await stop.wait()


def main() -> None:
    """Parse the arguments, die with the parent test, serve."""
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.standin")
    parser.add_argument("model")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--pin-gpus", type=int, default=0, help="GPUs its model config pins (default: none)")
    args = parser.parse_args()
    if os.environ.get("FERRY_PARENT_PID", "").isdigit():
        die_with_parent(int(os.environ.pop("FERRY_PARENT_PID")))
    asyncio.run(serve(args.model, args.ready_file, args.pin_gpus))


if __name__ == "__main__":
    main()
