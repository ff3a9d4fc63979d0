"""Running a batch runtime in a process: its contract from flags, its gRPC server and metrics endpoint.

Two commands host a runtime and share this module: ``ferry batch-runtime``
(the runtime alone, :mod:`agent.batch.main`) and ``ferry node --batch-runtime``
(the runtime beside the node's agent, which registers its models with the
control plane, :mod:`agent.main`).

- :class:`RuntimeSpec`: what to host, as a frozen dataclass built from flags
  (:func:`add_arguments`, :func:`spec_from_args`; the node's flags carry a
  ``batch-`` prefix: ``--batch-model``, ``--batch-max-batch``, …).
  ``max_wait`` is derived from ``budget_ms`` and ``batch_ms``
  (:mod:`agent.batch.budget`) unless ``max_wait_ms`` overrides it; the gang
  model, if named, needs all the node's GPUs per batch.
- :class:`HostedRuntime`: the runtime, its KServe v2 server
  (:mod:`agent.batch.server`) and its ``/metrics`` endpoint, started and
  stopped together on 127.0.0.1 ports chosen by the kernel unless given.

Defaults: model ``batchstring`` (the reference function), 100 inputs per
batch, 1 GPU per batch, 500 ms budget, 100 ms batches, 2,000 pending per
model, aging on at 200 ms, fault injection off.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web

from agent.batch import metrics
from agent.batch.budget import LatencyBudget, derive
from agent.batch.dispatch import ModelContract, NodeDispatcher
from agent.batch.gpusched import SchedulerConfig
from agent.batch.reference import DEFAULT_FUNCTION, load_function
from agent.batch.runtime import VERSION, BatchRuntime, HostedModel
from agent.batch.server import serve
from ferry.errors import ConfigError
from ferry.tls import TLSConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeSpec:
    """The models a runtime hosts, their contract, and the node's GPUs."""

    function: str = DEFAULT_FUNCTION
    model: str = "batchstring"
    gang_model: str | None = None
    version: str = VERSION
    gpus: int = 8
    max_batch: int = 100
    gpus_per_batch: int = 1
    budget_ms: float = 500.0
    batch_ms: float = 100.0
    max_wait_ms: float | None = None
    max_pending: int = 2000
    age_limit_ms: float = 200.0
    aging: bool = True
    allow_faults: bool = False

    def contracts(self) -> list[ModelContract]:
        """The hosted models' contracts; raises ConfigError."""
        budget = LatencyBudget(budget_s=self.budget_ms / 1e3, batch_s=self.batch_ms / 1e3)
        wait = derive(budget).max_wait_s if self.max_wait_ms is None else self.max_wait_ms / 1e3
        common: dict[str, Any] = {"max_batch": self.max_batch, "batch_s": self.batch_ms / 1e3, "max_wait_s": wait,
                                  "max_pending": self.max_pending}
        out = [ModelContract(name=self.model, gpus_per_batch=self.gpus_per_batch, **common)]
        if self.gang_model:
            if self.gang_model == self.model:
                raise ConfigError("gang_model", "must differ from the model")
            out.append(ModelContract(name=self.gang_model, gpus_per_batch=self.gpus, **common))
        return out

    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(gpus=self.gpus, aging=self.aging, age_limit_s=self.age_limit_ms / 1e3)


# (flag suffix, RuntimeSpec field, argparse keywords); gpus and addresses are the command's own flags.
_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("function", "function", {"help": "batch function module:function (default %(default)s)"}),
    ("model", "model", {"help": "model name (default %(default)s)"}),
    ("gang-model", "gang_model", {"help": "also host the function as NAME, needing all the node's GPUs per batch"}),
    ("version", "version", {"help": "model version served (default %(default)s)"}),
    ("max-batch", "max_batch", {"type": int, "help": "inputs per batch at most (default %(default)s)"}),
    ("gpus-per-batch", "gpus_per_batch", {"type": int, "help": "GPUs one batch takes (default %(default)s)"}),
    ("budget-ms", "budget_ms", {"type": float, "help": "P95 budget end to end (default %(default)s)"}),
    ("batch-ms", "batch_ms", {"type": float, "help": "time of one batch (default %(default)s)"}),
    ("max-wait-ms", "max_wait_ms", {"type": float, "help": "override the max_wait derived from the budget"}),
    ("max-pending", "max_pending", {"type": int, "help": "pending requests per model (default %(default)s)"}),
    ("age-limit-ms", "age_limit_ms", {"type": float, "help": "aging limit of gang scheduling (default %(default)s)"}),
]


def _flag(prefix: str, suffix: str) -> str:
    return suffix if suffix.startswith(prefix) else prefix + suffix  # "batch-" + "batch-ms" stays "batch-ms"


def add_arguments(parser: argparse.ArgumentParser | Any, *, prefix: str = "", version: str = VERSION) -> None:
    """Add the contract flags (each ``--{prefix}{name}``) to ``parser`` or an argument group."""
    defaults = RuntimeSpec(version=version)
    for suffix, field, kwargs in _FLAGS:
        flag = _flag(prefix, suffix)
        parser.add_argument(f"--{flag}", dest=flag.replace("-", "_"), default=getattr(defaults, field), **kwargs)
    flag = _flag(prefix, "no-aging")
    parser.add_argument(f"--{flag}", dest=flag.replace("-", "_"), action="store_true",
                        help="turn aging off (small batches may starve)")
    parser.add_argument("--allow-fault-injection", action="store_true",
                        help="accept 'kill [N]' / 'restore N' on the reserved model ferry.fault")


def spec_from_args(args: argparse.Namespace, *, gpus: int, prefix: str = "") -> RuntimeSpec:
    """The spec the flags of :func:`add_arguments` describe; raises ConfigError for a bad value."""
    values = {field: getattr(args, _flag(prefix, suffix).replace("-", "_")) for suffix, field, _ in _FLAGS}
    spec = RuntimeSpec(gpus=gpus, aging=not getattr(args, _flag(prefix, "no-aging").replace("-", "_")),
                       allow_faults=args.allow_fault_injection, **values)
    NodeDispatcher(spec.contracts(), spec.scheduler())  # validate every limit now, before anything starts
    return spec


class HostedRuntime:
    """A started runtime with its gRPC server and metrics endpoint; :meth:`stop` ends all three."""

    def __init__(self, runtime: BatchRuntime, server: grpc.aio.Server, http: web.AppRunner, *, host: str,
                 port: int, metrics_port: int) -> None:
        self.runtime, self._server, self._http = runtime, server, http
        self.address = f"{host}:{port}"
        self.metrics_address = f"{host}:{metrics_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}/metrics"

    @classmethod
    async def start(cls, spec: RuntimeSpec, *, host: str = "127.0.0.1", port: int = 0, metrics_port: int = 0,
                    on_change: Callable[[], None] | None = None, tls: TLSConfig | None = None) -> HostedRuntime:
        """Load the function, start the runtime, then its server and metrics; raises ConfigError."""
        function = load_function(spec.function)
        hosted = [HostedModel(c, function) for c in spec.contracts()]
        runtime = BatchRuntime(hosted, spec.scheduler(), version=spec.version, on_change=on_change)
        await runtime.start()
        server, bound = await serve(runtime, f"{host}:{port}", allow_faults=spec.allow_faults, tls=tls)
        http, metrics_bound = await metrics.serve(f"{host}:{metrics_port}", runtime.metrics)
        return cls(runtime, server, http, host=host, port=bound, metrics_port=metrics_bound)

    async def stop(self, grace: float = 2.0) -> None:
        """Stop taking calls (in-flight ones get ``grace`` seconds), then the runtime and the metrics endpoint."""
        await self._server.stop(grace=grace)
        await self.runtime.stop()
        await self._http.cleanup()
