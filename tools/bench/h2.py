"""Ferry's proxy against a reference HTTP/2 proxy, both driven by ``h2load`` in front of the same replica.

On the rig of :mod:`tools.bench.rig` (one near-free simulated replica, a
control plane, Ferry's proxy; ``--workers N`` adds a proxy of N workers), an
nginx ``grpc_pass`` proxy (``worker_processes`` 1, and N beside N workers)
is started on the same replica, then ``h2load`` (one process, ``--connections``
x ``--streams`` in flight, a framed gRPC body, ``--seconds``) measures, one
after the other in the same run:

- ``direct``: the replica's KServe v2 ``ModelInfer`` (1 output token);
- ``nginx``: the same request through nginx;
- ``ferry``: ``ferry.v1.Inference/Infer`` with the same prompt and
  ``max_tokens`` 1 through Ferry's proxy (auth, validation, admission, the
  pick, forwarding with tritonclient), and ``ferry_workers`` through the
  proxy of N workers.

h2load counts an HTTP 200 as a success whatever the gRPC status in the
trailers, so each Ferry figure is checked against the proxy's own
``ferry_proxy_requests_total{status="OK"}``: the run fails when fewer than
99 % of h2load's successes were answered OK. The figure to read is
``ferry / nginx`` (the goal: 0.8). nginx and h2load come from Debian
(``apt-get install nginx-light nghttp2-client``); the benchmark says so and
stops when either is missing. Writes ``bench-results/h2.json``.

Run: ``python -m tools.bench.h2 [--seconds 5] [--connections 4] [--streams 64] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.etcd import free_port
from ferry.grpcutil import split_address
from ferry.v1 import common_pb2, inference_pb2
from tools.bench.overhead import direct_request, served
from tools.bench.rig import PROMPT, ROOT, Fleet, one_replica_fleet

KSERVE_PATH = "/inference.GRPCInferenceService/ModelInfer"
FERRY_PATH = "/ferry.v1.Inference/Infer"
NGINX_CONF = """daemon off;
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    upstream replica {{ server {replica}; keepalive 64; keepalive_requests 1000000; }}
    server {{
        listen {listen} http2;
        location / {{ grpc_pass grpc://replica; }}
    }}
}}
"""


def framed(message: Any) -> bytes:
    """One gRPC message as it travels: a zero (uncompressed) byte, its 4-byte big-endian length, the bytes."""
    data: bytes = message.SerializeToString()
    return b"\x00" + len(data).to_bytes(4, "big") + data


def h2load(url: str, body: Path, args: argparse.Namespace, headers: dict[str, str]) -> dict[str, Any]:
    """One h2load run; its rate and request counts (raises when it reports errors or none succeeded)."""
    cmd = ["h2load", "-D", str(args.seconds), "-c", str(args.connections), "-m", str(args.streams),
           "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers"]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=args.seconds + 60).stdout
    rate = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
    counts = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                       out)
    if rate is None or counts is None:
        raise RuntimeError(f"h2load printed no figures:\n{out}")
    _total, _done, ok, failed, errored = (int(g) for g in counts.groups())
    if ok == 0 or failed or errored:
        raise RuntimeError(f"h2load: {ok} succeeded, {failed} failed, {errored} errored against {url}:\n{out}")
    latency = re.search(r"time for request:\s+([\d.]+)(\w+)\s+([\d.]+)(\w+)\s+([\d.]+)(\w+)", out)
    mean_ms = None
    if latency is not None:
        mean, unit = float(latency.group(5)), latency.group(6)
        mean_ms = round(mean / 1000 if unit == "us" else mean * 1000 if unit == "s" else mean, 3)
    return {"rps": float(rate.group(1)), "succeeded": ok, "mean_ms": mean_ms}


def ferry_run(name: str, ready: dict[str, Any], body: Path, key: str, args: argparse.Namespace) -> dict[str, Any]:
    """h2load through one Ferry proxy (every worker's metrics), checked against its OK count."""
    metrics = [w["metrics"] for w in ready.get("workers", [])] or [ready["metrics"]]
    before = sum(served(m) for m in metrics)
    result = h2load(f"http://{ready['grpc']}{FERRY_PATH}", body, args, {"x-api-key": key})
    answered = sum(served(m) for m in metrics) - before
    result["answered_ok"] = answered
    if answered < 0.99 * result["succeeded"]:
        raise RuntimeError(f"{name}: h2load counted {result['succeeded']} successes, the proxy answered "
                           f"{answered:.0f} OK: the body or the key is wrong")
    return result


def nginx(workdir: Path, replica: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    """nginx as a gRPC proxy to ``replica`` with ``workers`` worker processes; (process, address)."""
    listen = f"127.0.0.1:{free_port()}"
    conf = workdir / f"nginx-{workers}.conf"
    conf.write_text(NGINX_CONF.format(workers=workers, dir=workdir, replica=replica, listen=listen))
    proc = subprocess.Popen(["nginx", "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    host, port = split_address(listen)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # polled: nginx writes no ready file
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        raise RuntimeError(f"nginx did not listen on {host}:{port}; see {workdir / 'error.log'}")
    return proc, listen


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop an nginx started here (its process group), then reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGQUIT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def bench(fleet: Fleet, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every path of the module doc, one after the other, on the same replica."""
    model = fleet.replica.get("kserve_model") or fleet.replica["model"]
    kserve = workdir / "kserve.bin"
    kserve.write_bytes(framed(direct_request(model)))
    ferry_body = workdir / "ferry.bin"
    ferry_body.write_bytes(framed(inference_pb2.InferRequest(model=fleet.replica["model"], prompt=PROMPT,
                                                             max_tokens=1, tier=common_pb2.TIER_INTERACTIVE)))
    out: dict[str, Any] = {"direct": h2load(f"http://{fleet.replica['address']}{KSERVE_PATH}", kserve, args, {})}
    proc, listen = nginx(workdir, fleet.replica["address"], 1)
    try:
        out["nginx"] = h2load(f"http://{listen}{KSERVE_PATH}", kserve, args, {})
    finally:
        stop(proc)
    out["ferry"] = ferry_run("ferry", fleet.proxy, ferry_body, fleet.key, args)
    if args.workers > 1:
        proc, listen = nginx(workdir, fleet.replica["address"], args.workers)
        try:
            out["nginx_workers"] = h2load(f"http://{listen}{KSERVE_PATH}", kserve, args, {})
        finally:
            stop(proc)
        out["ferry_workers"] = ferry_run("ferry_workers", fleet.others[0], ferry_body, fleet.key, args)
        out["ferry_workers_over_nginx_workers"] = round(out["ferry_workers"]["rps"] / out["nginx_workers"]["rps"], 3)
    out["ferry_over_nginx"] = round(out["ferry"]["rps"] / out["nginx"]["rps"], 3)
    out["nginx_over_direct"] = round(out["nginx"]["rps"] / out["direct"]["rps"], 3)
    out["ferry_over_direct"] = round(out["ferry"]["rps"] / out["direct"]["rps"], 3)
    out["load"] = {"connections": args.connections, "streams": args.streams, "seconds": args.seconds,
                   "workers": args.workers, "cpus": os.cpu_count()}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rig, nginx and h2load; print the rates and ratios; write the JSON."""
    p = argparse.ArgumentParser(prog="python -m tools.bench.h2", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=5, help="length of each h2load run")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--streams", type=int, default=64, help="streams in flight per connection")
    p.add_argument("--workers", type=int, default=1, help="also a Ferry proxy of N workers, and nginx with N")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "h2.json"))
    args = p.parse_args(argv)
    missing = [tool for tool in ("h2load", "nginx") if shutil.which(tool) is None]
    if missing:
        print(f"missing {', '.join(missing)}: apt-get install nginx-light nghttp2-client", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= 64 or not 1 <= args.seconds <= 600:
        p.error("--workers must be 1 to 64 and --seconds 1 to 600")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    more = [["--workers", str(args.workers)]] if args.workers > 1 else []
    with tempfile.TemporaryDirectory(prefix="ferry-bench-h2-") as tmp, one_replica_fleet(more_proxies=more) as fleet:
        result = bench(fleet, args, Path(tmp))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("direct", "nginx", "ferry", "nginx_workers", "ferry_workers"):
        if name in result:
            r = result[name]
            print(f"{name:<14} {r['rps']:9.1f} req/s  mean {r['mean_ms']} ms  ({r['succeeded']} succeeded)")
    print(f"ferry / nginx {result['ferry_over_nginx']}  (goal 0.8); nginx / direct {result['nginx_over_direct']}; "
          f"ferry / direct {result['ferry_over_direct']}")
    if "ferry_workers_over_nginx_workers" in result:
        print(f"with {args.workers} workers each: ferry / nginx {result['ferry_workers_over_nginx_workers']}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
