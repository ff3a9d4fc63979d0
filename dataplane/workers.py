"""``ferry proxy --workers N``: N proxy processes behind one gRPC port and one HTTP port, supervised.

A Python proxy uses one core; N workers use N. The default N is
:func:`default_workers`: the CPUs the process may run on, capped by the
container's CPU quota (cgroup v2 ``cpu.max``). The parent runs no proxy of
its own: it starts worker 1 (``ferry proxy --workers 1`` with the parent's
flags), reads the addresses it bound (port 0 becomes a port), then starts
workers 2..N on the same addresses; gRPC servers set ``SO_REUSEPORT`` on
Linux and the HTTP front door asks for it, so the kernel spreads new
connections over the workers. Each worker is a whole proxy: its own table
watch, its own usage reports and its own id, ``{id}-{k}`` (the control plane
sees N proxies), its own ``/metrics`` (``--metrics-listen`` port P: worker k
binds P + k - 1; port 0: any). Workers' output is the parent's.

:func:`worker_argv` is the pure part (the parent's argv to worker k's);
:func:`run` the edge: the workers are :class:`ferry.procs.Child` processes
that die with the parent, watched by :class:`ferry.supervise.Supervisor`
(a dead worker is restarted on its addresses with backoff; given up on in a
crash loop), the same mechanism as ``ferry up``'s. The parent's ready file is
written once every worker is ready, and again when one is restarted:
``grpc``, ``http`` (when served), ``metrics`` and ``proxy_id`` (worker 1's),
``pid`` (the parent's), ``region``, and ``workers``: ``[{"proxy_id", "pid",
"metrics"}]``. SIGTERM or SIGINT to the parent is passed to every worker at
once, so all drain together (:meth:`dataplane.server.Proxy.drain`); a worker
still running after ``drain_delay_seconds + drain_grace_seconds`` and 5 s more
is killed. Exit status: 0 after a clean stop, 1 when a worker did not start
or every worker was given up on (so that an orchestrator starts the proxy again).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataplane.config import ProxyConfig
from ferry.process import write_ready_file
from ferry.procs import Child, ChildFailed, stop_all
from ferry.supervise import Supervisor

MAX_WORKERS = 256
POLL_SECONDS = 0.2
STOP_MARGIN_SECONDS = 5.0
OWN_FLAGS = ("--workers", "--ready-file", "--id", "--metrics-listen")  # the parent sets these per worker


CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def cores(affinity: int, cpu_max: str | None) -> int:
    """The cores this process may use: the CPUs it may run on, capped by a cgroup CPU quota (``cpu_max``,
    the text of ``cpu.max``, rounded up), so that a container limited to 2 CPUs on a large host runs 2."""
    count = max(1, affinity)
    fields = (cpu_max or "").split()
    if len(fields) == 2 and fields[0] != "max":
        try:
            quota, period = int(fields[0]), int(fields[1])
        except ValueError:
            return count
        if quota > 0 and period > 0:
            count = min(count, max(1, math.ceil(quota / period)))
    return count


def default_workers() -> int:
    """:func:`cores` of this process (the default of ``--workers``)."""
    try:
        cpu_max: str | None = CPU_MAX.read_text()
    except OSError:
        cpu_max = None
    return cores(len(os.sched_getaffinity(0)), cpu_max)


def without(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` without ``flags`` and their values (``--flag value`` and ``--flag=value`` forms)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def metrics_address(listen: str, k: int) -> str:
    """Worker ``k``'s (1-based) metrics address: port P + k - 1 of ``listen``, or port 0 for 0."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + k - 1 if int(port) else 0}"


def worker_argv(argv: Sequence[str], k: int, *, proxy_id: str, metrics_listen: str,
                listen: str | None = None, http_listen: str | None = None) -> list[str]:
    """The ``ferry proxy`` arguments of worker ``k`` (1-based): the parent's flags, one worker, its own id and
    metrics address, and the addresses given (for k >= 2, those worker 1 bound: ``listen``, ``http_listen``)."""
    args = without(argv, OWN_FLAGS)
    for flag, value in (("--listen", listen), ("--http-listen", http_listen)):
        if value:
            args = [*without(args, [flag]), flag, value]
    return ["proxy", *args, "--workers", "1", "--id", f"{proxy_id}-{k}",
            "--metrics-listen", metrics_address(metrics_listen, k)]


def describe(workers: Sequence[Child], region: str) -> dict[str, Any]:
    """The parent's ready file (see the module docstring)."""
    first = workers[0].ready
    info: dict[str, Any] = {key: first[key] for key in ("grpc", "http", "metrics", "proxy_id") if key in first}
    info |= {"pid": os.getpid(), "region": region,
             "workers": [{"proxy_id": w.ready.get("proxy_id"), "pid": w.pid, "metrics": w.ready.get("metrics")}
                         for w in workers]}
    return info


def run(argv: Sequence[str], args: argparse.Namespace, config: ProxyConfig, count: int) -> int:
    """Run ``count`` workers until SIGTERM or SIGINT (see the module docstring)."""
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    settings = config.settings
    times = settings.server.drain()
    workdir = Path(tempfile.mkdtemp(prefix="ferry-proxy-workers-"))
    workers: list[Child] = []
    try:
        try:
            listen: str | None = args.listen  # explicit, so that a restart pins what worker 1 bound
            http_listen: str | None = args.http_listen if args.http_listen is not None else settings.http.http_listen
            for k in range(1, count + 1):
                child = Child(f"worker-{k}", worker_argv(argv, k, proxy_id=settings.proxy_id,
                                                         metrics_listen=args.metrics_listen, listen=listen,
                                                         http_listen=http_listen),
                              workdir, inherit_output=True).start()
                workers.append(child)
                if k == 1:  # the others bind what it bound
                    ready = child.wait_ready()
                    listen, http_listen = ready["grpc"], ready.get("http") or None
            for child in workers:
                child.wait_ready()
        except ChildFailed as exc:
            print(f"ferry proxy: {exc}", file=sys.stderr, flush=True)
            return 1
        supervisor = Supervisor(workers, name="ferry proxy", metric="ferry_proxy_worker_restarts_total",
                                on_change=lambda: write_ready_file(args.ready_file, describe(workers, settings.region)))
        write_ready_file(args.ready_file, describe(workers, settings.region))
        print(f"ferry proxy: {count} workers serving {listen}", flush=True)
        while not stop:
            supervisor.poll()
            if len(supervisor.given_up) == count:
                print("ferry proxy: every worker was given up on; exiting", file=sys.stderr, flush=True)
                return 1
            time.sleep(POLL_SECONDS)
        return 0
    finally:
        stop_all(workers, timeout=times.delay + times.grace + STOP_MARGIN_SECONDS)
        shutil.rmtree(workdir, ignore_errors=True)
