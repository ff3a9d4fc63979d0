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
  proxy of N workers;
- ``envoy_kserve``: the direct run's ``ModelInfer`` through Ferry's native
  data path (``ferry envoy``: the Envoy binary, its two endpoint pickers,
  ``ferry picker``, deciding each request over ``ext_proc``; API key and tier
  in headers), the bytes forwarded to the replica untouched;
- ``direct_openai`` / ``envoy_openai``: OpenAI ``POST /v1/completions``
  (``max_tokens`` 1) to the replica's HTTP face and through Envoy, both
  HTTP/1.1 (``--h1``, one request per connection at a time,
  ``connections x streams`` connections); ``envoy_openai_h2c`` tries the
  same over h2c and records what came back (with ``[envoy]
  upstream_protocol = "downstream"``, the default, Envoy speaks HTTP/2 to
  the HTTP/1.1 face: 502).

And streamed, ``--stream-tokens`` (8) tokens per request:
``direct_stream`` / ``nginx_stream`` (KServe ``ModelStreamInfer``, one
response per token), ``ferry_stream`` (``ferry.v1.Inference/InferStream``
through the relay), ``envoy_stream`` (OpenAI server-sent events through
Envoy over HTTP/1.1; the pickers see no token, Envoy carries them).

Every run also records the CPU seconds each process on the path used
(``/proc``, before and after; h2load's from its rusage) and gives them per
request in microseconds (``cpu_us_per_request``): ``replica`` (the node:
the replica and its agent), ``proxy``, ``envoy`` (the binary),
``envoy_wrapper`` (``ferry envoy``, which only watches the table),
``picker-1``, ``picker-2``, ``nginx`` (master and workers), ``h2load``; a
process idle in a run shows near 0.

h2load counts an HTTP 200 as a success whatever the gRPC status in the
trailers, so each Ferry figure is checked against the proxy's own
``ferry_proxy_requests_total{status="OK"}`` (the Envoy runs against the
pickers' same counter): the run fails when fewer than 99 % of h2load's
successes were answered OK. The figures to read are ``ferry / nginx`` and
``envoy / nginx`` (the goal: 0.8), unary and streamed. nginx and h2load come from Debian
(``apt-get install nginx-light nghttp2-client``); the benchmark says so and
stops when either is missing. Writes ``bench-results/h2.json``.

Run: ``python -m tools.bench.h2 [--seconds 5] [--connections 4] [--streams 64] [--workers 2] [--stream-tokens 8]
[--no-envoy]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tomli_w import dumps

from ferry.grpcutil import split_address
from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2
from ferry_cli.up.ready import wait_routable
from harness.etcd import free_port
from tools.bench.overhead import direct_request, served
from tools.bench.rig import MODEL, PROMPT, ROOT, Fleet, proxy_ids, rig_config
from tools.peers.procs import cpu_seconds, tree
from tools.peers.routers import envoy_binary_pid

KSERVE_PATH = "/inference.GRPCInferenceService/ModelInfer"
KSERVE_STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
FERRY_PATH = "/ferry.v1.Inference/Infer"
FERRY_STREAM_PATH = "/ferry.v1.Inference/InferStream"
OPENAI_PATH = "/v1/completions"
GRPC_HEADERS = {"content-type": "application/grpc", "te": "trailers"}
JSON_HEADERS = {"content-type": "application/json"}
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


def h2load(url: str, body: Path, args: argparse.Namespace, headers: dict[str, str], *,
           h1: bool = False) -> dict[str, Any]:
    """One h2load run; its rate, request counts and its own CPU seconds (raises when it reports errors or none
    succeeded). ``headers``: gRPC's unless a content-type is given; ``h1``: HTTP/1.1, one request per
    connection at a time, ``connections x streams`` connections (at most 1,000)."""
    if h1:
        shape = ["--h1", "-c", str(min(1000, args.connections * args.streams)), "-m", "1"]
    else:
        shape = ["-c", str(args.connections), "-m", str(args.streams)]
    cmd = ["h2load", "-D", str(args.seconds), *shape, "-d", str(body)]
    for name, value in ({} if "content-type" in headers else GRPC_HEADERS).items():
        cmd += ["-H", f"{name}: {value}"]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    with tempfile.TemporaryFile() as captured:
        proc = subprocess.Popen([*cmd, url], stdout=captured, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + args.seconds + 60
        while True:
            pid, _status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = 0
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"h2load against {url} did not end")
            time.sleep(0.05)
        captured.seek(0)
        out = captured.read().decode("utf-8", "replace")
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
    return {"rps": float(rate.group(1)), "succeeded": ok, "mean_ms": mean_ms, "seconds": args.seconds,
            "h2load_cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


@dataclasses.dataclass(frozen=True)
class Processes:
    """The processes whose CPU each run records: name -> root pids (each with its descendants, unless solo)."""

    roots: dict[str, list[int]]
    solo: dict[str, int]

    def snapshot(self) -> dict[str, float]:
        out = {name: sum(tree(pids).values()) for name, pids in self.roots.items()}
        out.update({name: cpu_seconds(pid) for name, pid in self.solo.items()})
        return out


def measured(procs: Processes, run: Any, extra: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """``run()`` (an h2load result) with the CPU each process used meanwhile, in all and per request."""
    watched = Processes({**procs.roots, **(extra or {})}, procs.solo)
    before = watched.snapshot()
    result: dict[str, Any] = run()
    after = watched.snapshot()
    used = {name: round(after[name] - before[name], 3) for name in before}
    used["h2load"] = result.pop("h2load_cpu_s")
    result["cpu_s"] = used
    result["cpu_us_per_request"] = {name: round(v * 1e6 / result["succeeded"], 1) for name, v in used.items()}
    return result


def envoy_stats(admin: str) -> dict[str, float]:
    """Envoy's counters that say what became of the requests: forwarded to a replica, or answered by a picker."""
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=5) as response:
        text = response.read().decode()
    wanted = {"cluster.ferry_replicas.upstream_rq_2xx": "forwarded_2xx",
              "cluster.ferry_replicas.upstream_rq_total": "forwarded",
              "http.ferry.ext_proc.immediate_responses_sent": "picker_immediate_responses",
              "http.ferry.ext_proc.streams_failed": "ext_proc_streams_failed"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name in wanted and value.strip().isdigit():
            out[wanted[name]] = float(value)
    return out


def checked(name: str, metrics: Sequence[str], run: Any, *, admin: str = "") -> dict[str, Any]:
    """``run()`` checked against the OK count of the proxies or pickers at ``metrics`` (host:port each). With
    Envoy's ``admin``, what Envoy did with the requests is recorded and a shortfall is reported, not raised:
    h2load counts a picker's refusal of a gRPC request as a success (Envoy answers it with HTTP 200 and the
    gRPC status in the trailers)."""
    before = sum(served(m) for m in metrics)
    stats = envoy_stats(admin) if admin else {}
    result: dict[str, Any] = run()
    answered = sum(served(m) for m in metrics) - before
    result["answered_ok"] = answered
    if admin:
        after = envoy_stats(admin)
        result["envoy"] = {k: after[k] - stats[k] for k in after}
        result["ok_share"] = round(answered / result["succeeded"], 3) if result["succeeded"] else None
        result["ok_rps"] = round(answered / result.get("seconds", 1), 1)
        return result
    if answered < 0.99 * result["succeeded"]:
        raise RuntimeError(f"{name}: h2load counted {result['succeeded']} successes, Ferry answered "
                           f"{answered:.0f} OK: the body or the key is wrong")
    return result


def ferry_run(name: str, ready: dict[str, Any], body: Path, key: str, args: argparse.Namespace,
              path: str = FERRY_PATH) -> dict[str, Any]:
    """h2load through one Ferry proxy (every worker's metrics), checked against its OK count."""
    metrics = [w["metrics"] for w in ready.get("workers", [])] or [ready["metrics"]]
    return checked(name, metrics, lambda: h2load(f"http://{ready['grpc']}{path}", body, args, {"x-api-key": key}))


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


@dataclasses.dataclass(frozen=True)
class EnvoyPath:
    """Ferry's native data path on the rig: Envoy's HTTP listener, the pickers' metrics, the processes."""

    http: str
    picker_metrics: tuple[str, ...]
    pids: dict[str, int]
    admin: str = ""


def envoy_runs(fleet: Fleet, envoy: EnvoyPath, procs: Processes, args: argparse.Namespace,
               workdir: Path) -> dict[str, Any]:
    """``envoy_kserve``, ``direct_openai``, ``envoy_openai`` and ``envoy_stream`` (module doc)."""
    model = fleet.replica["model"]
    auth = {"x-api-key": fleet.key, "x-ferry-tier": "interactive"}
    kserve = workdir / "kserve-envoy.bin"
    kserve.write_bytes(framed(direct_request(fleet.replica.get("kserve_model") or model)))
    unary = workdir / "openai.json"
    unary.write_text(json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 1}))
    streamed = workdir / "openai-stream.json"
    streamed.write_text(json.dumps({"model": model, "prompt": PROMPT, "max_tokens": args.stream_tokens,
                                    "stream": True}))
    base = f"http://{envoy.http}"
    out: dict[str, Any] = {}
    out["envoy_kserve"] = measured(procs, lambda: checked("envoy_kserve", envoy.picker_metrics, lambda: h2load(
        f"{base}{KSERVE_PATH}", kserve, args, auth), admin=envoy.admin))
    http_face = fleet.replica.get("http") or ""
    if http_face:
        out["direct_openai"] = measured(procs, lambda: h2load(f"http://{http_face}{OPENAI_PATH}", unary, args,
                                                              JSON_HEADERS, h1=True))
    out["envoy_openai"] = measured(procs, lambda: checked("envoy_openai", envoy.picker_metrics, lambda: h2load(
        f"{base}{OPENAI_PATH}", unary, args, {**JSON_HEADERS, **auth}, h1=True), admin=envoy.admin))
    out["envoy_stream"] = measured(procs, lambda: checked("envoy_stream", envoy.picker_metrics, lambda: h2load(
        f"{base}{OPENAI_PATH}", streamed, args, {**JSON_HEADERS, **auth}, h1=True), admin=envoy.admin))
    try:  # OpenAI over h2c: Envoy's default upstream protocol follows the client's, the HTTP face is HTTP/1.1
        out["envoy_openai_h2c"] = h2load(f"{base}{OPENAI_PATH}", unary, args, {**JSON_HEADERS, **auth})
    except RuntimeError as exc:
        lines = str(exc).splitlines()
        out["envoy_openai_h2c"] = {"error": lines[0], "status": next((x for x in lines if "status codes" in x), "")}
    return out


def bench(fleet: Fleet, args: argparse.Namespace, workdir: Path, envoy: EnvoyPath | None = None,
          procs: Processes | None = None) -> dict[str, Any]:
    """Every path of the module doc, one after the other, on the same replica."""
    procs = procs or Processes({"replica": [fleet.node_pid]} if fleet.node_pid else {}, {})
    model = fleet.replica.get("kserve_model") or fleet.replica["model"]
    kserve = workdir / "kserve.bin"
    kserve.write_bytes(framed(direct_request(model)))
    kserve_stream = workdir / "kserve-stream.bin"
    kserve_stream.write_bytes(framed(direct_request(model, args.stream_tokens)))
    ferry_body = workdir / "ferry.bin"
    ferry_body.write_bytes(framed(inference_pb2.InferRequest(model=fleet.replica["model"], prompt=PROMPT,
                                                             max_tokens=1, tier=common_pb2.TIER_INTERACTIVE)))
    ferry_stream = workdir / "ferry-stream.bin"
    ferry_stream.write_bytes(framed(inference_pb2.InferRequest(model=fleet.replica["model"], prompt=PROMPT,
                                                               max_tokens=args.stream_tokens,
                                                               tier=common_pb2.TIER_INTERACTIVE)))
    address = fleet.replica["address"]
    out: dict[str, Any] = {"direct": measured(procs, lambda: h2load(f"http://{address}{KSERVE_PATH}", kserve, args,
                                                                     {}))}
    out["direct_stream"] = measured(procs, lambda: h2load(f"http://{address}{KSERVE_STREAM_PATH}", kserve_stream,
                                                          args, {}))
    proc, listen = nginx(workdir, address, 1)
    try:
        group = {"nginx": [proc.pid]}
        out["nginx"] = measured(procs, lambda: h2load(f"http://{listen}{KSERVE_PATH}", kserve, args, {}), group)
        out["nginx_stream"] = measured(procs, lambda: h2load(f"http://{listen}{KSERVE_STREAM_PATH}", kserve_stream,
                                                             args, {}), group)
    finally:
        stop(proc)
    out["ferry"] = measured(procs, lambda: ferry_run("ferry", fleet.proxy, ferry_body, fleet.key, args))
    out["ferry_stream"] = measured(procs, lambda: ferry_run("ferry_stream", fleet.proxy, ferry_stream, fleet.key,
                                                            args, FERRY_STREAM_PATH))
    if envoy is not None:
        out.update(envoy_runs(fleet, envoy, procs, args, workdir))
        out["envoy_over_nginx"] = round(out["envoy_kserve"]["rps"] / out["nginx"]["rps"], 3)
        out["envoy_stream_over_nginx_stream"] = round(out["envoy_stream"]["rps"] / out["nginx_stream"]["rps"], 3)
        out["envoy_over_ferry"] = round(out["envoy_kserve"]["rps"] / out["ferry"]["rps"], 3)
        out["envoy_stream_over_ferry_stream"] = round(out["envoy_stream"]["rps"] / out["ferry_stream"]["rps"], 3)
    out["ferry_stream_over_nginx_stream"] = round(out["ferry_stream"]["rps"] / out["nginx_stream"]["rps"], 3)
    if args.workers > 1:
        proc, listen = nginx(workdir, fleet.replica["address"], args.workers)
        try:
            out["nginx_workers"] = measured(procs, lambda: h2load(f"http://{listen}{KSERVE_PATH}", kserve, args, {}),
                                            {"nginx": [proc.pid]})
        finally:
            stop(proc)
        out["ferry_workers"] = measured(procs, lambda: ferry_run("ferry_workers", fleet.others[0], ferry_body,
                                                                 fleet.key, args))
        out["ferry_workers_over_nginx_workers"] = round(out["ferry_workers"]["rps"] / out["nginx_workers"]["rps"], 3)
    out["ferry_over_nginx"] = round(out["ferry"]["rps"] / out["nginx"]["rps"], 3)
    out["nginx_over_direct"] = round(out["nginx"]["rps"] / out["direct"]["rps"], 3)
    out["ferry_over_direct"] = round(out["ferry"]["rps"] / out["direct"]["rps"], 3)
    out["load"] = {"connections": args.connections, "streams": args.streams, "seconds": args.seconds,
                   "workers": args.workers, "stream_tokens": args.stream_tokens, "cpus": os.cpu_count()}
    return out


@contextlib.contextmanager
def h2_fleet(more_proxies: Sequence[Sequence[str]] = (), *, envoy: bool = True,
             pickers: int = 2) -> Iterator[tuple[Fleet, EnvoyPath | None, Processes]]:
    """The rig of :func:`tools.bench.rig.one_replica_fleet` (the same config, replica and proxies) and, with
    ``envoy``, ``pickers`` endpoint pickers and ``ferry envoy`` asking them; stopped on exit."""
    key, config = rig_config()
    with tempfile.TemporaryDirectory(prefix="ferry-bench-h2-fleet-") as tmp:
        work = Path(tmp)
        (work / "ferry.toml").write_text(dumps(config))
        cfg = ["--config", str(work / "ferry.toml"), "--insecure"]
        children: list[Child] = []
        try:
            token = secrets.token_hex(16)
            cp = Child("controlplane", ["controlplane", *cfg], work, env={"FERRY_ADMIN_TOKEN": token}).start()
            children.append(cp)
            cp_addr = cp.wait_ready()["grpc"]
            proxy = Child("proxy", ["proxy", "--control-plane", cp_addr, "--id", "bench-proxy", "--workers", "1",
                                    *cfg], work).start()
            others = [Child(f"proxy-{k + 2}", ["proxy", "--control-plane", cp_addr, "--id", f"bench-proxy-{k + 2}",
                                               "--workers", "1", *args, *cfg], work).start()
                      for k, args in enumerate(more_proxies)]
            node = Child("node", ["node", "--node", "bench-node", "--control-plane", cp_addr,
                                  "--replica", f"{MODEL}:v1", *cfg], work).start()
            children += [proxy, *others, node]
            picks = [Child(f"picker-{k + 1}", ["picker", "--listen", "127.0.0.1:0", "--control-plane", cp_addr,
                                               "--id", f"picker-{k + 1}", *cfg], work).start()
                     for k in range(pickers if envoy else 0)]
            children += picks
            ready = proxy.wait_ready()
            node_ready = node.wait_ready()
            replica = node_ready["replicas"][0]
            readies = [ready, *(o.wait_ready() for o in others)]
            path: EnvoyPath | None = None
            roots = {"replica": [node.pid], "proxy": [proxy.pid]}
            solo: dict[str, int] = {}
            if picks:
                picked = [p.wait_ready() for p in picks]
                wrapper = Child("envoy", ["envoy", "--pickers", ",".join(r["picker"] for r in picked),
                                          "--control-plane", cp_addr, "--id", "bench-envoy",
                                          "--workdir", str(work / "envoy"), *cfg], work).start()
                children.append(wrapper)
                envoy_ready = wrapper.wait_ready(60)
                binary = int(envoy_ready.get("envoy_pid") or 0) or envoy_binary_pid(wrapper.pid, work)
                roots.update({"envoy": [binary], **{p.name: [p.pid] for p in picks}})
                solo["envoy_wrapper"] = wrapper.pid
                path = EnvoyPath(envoy_ready["http"], tuple(r["metrics"] for r in picked),
                                 {"envoy": binary, "envoy_wrapper": wrapper.pid, **{p.name: p.pid for p in picks}},
                                 envoy_ready.get("admin", ""))
                readies += picked
            for proxy_id in (i for r in readies for i in proxy_ids(r)):
                wait_routable(cp_addr, {replica["replica_id"]}, proxy_id, 30, children, admin_token=token)
            fleet = Fleet(proxy=ready, replica=replica, key=key, others=tuple(readies[1:1 + len(others)]),
                          node_pid=node_ready["pid"])
            yield fleet, path, Processes(roots, solo)
        finally:
            stop_all(children)


def print_rows(result: dict[str, Any]) -> None:
    """One line per run: rate, mean latency, successes and the CPU per request of each process."""
    for name in ("direct", "nginx", "ferry", "nginx_workers", "ferry_workers", "envoy_kserve", "direct_openai",
                 "envoy_openai", "direct_stream", "nginx_stream", "ferry_stream", "envoy_stream"):
        if name in result:
            r = result[name]
            cpu = ", ".join(f"{k} {v:g}" for k, v in r.get("cpu_us_per_request", {}).items() if v >= 0.5)
            ok = (f", {r['answered_ok']:.0f} answered OK by the pickers ({r['ok_share']}), Envoy "
                  f"{r['envoy']}") if "ok_share" in r else ""
            print(f"{name:<14} {r['rps']:9.1f} req/s  mean {r['mean_ms']} ms  ({r['succeeded']} succeeded{ok})  "
                  f"CPU us/request: {cpu}")


def main(argv: list[str] | None = None) -> int:
    """Run the rig, nginx and h2load; print the rates and ratios; write the JSON."""
    p = argparse.ArgumentParser(prog="python -m tools.bench.h2", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=5, help="length of each h2load run")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--streams", type=int, default=64, help="streams in flight per connection")
    p.add_argument("--workers", type=int, default=1, help="also a Ferry proxy of N workers, and nginx with N")
    p.add_argument("--stream-tokens", type=int, default=8, help="output tokens of each streamed request")
    p.add_argument("--no-envoy", dest="envoy", action="store_false", help="leave out Ferry's Envoy path")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "h2.json"))
    args = p.parse_args(argv)
    missing = [tool for tool in ("h2load", "nginx") if shutil.which(tool) is None]
    if missing:
        print(f"missing {', '.join(missing)}: apt-get install nginx-light nghttp2-client", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= 64 or not 1 <= args.seconds <= 600 or not 1 <= args.stream_tokens <= 4096:
        p.error("--workers must be 1 to 64, --seconds 1 to 600 and --stream-tokens 1 to 4096")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    more = [["--workers", str(args.workers)]] if args.workers > 1 else []
    with tempfile.TemporaryDirectory(prefix="ferry-bench-h2-") as tmp, \
            h2_fleet(more_proxies=more, envoy=args.envoy) as (fleet, envoy, procs):
        result = bench(fleet, args, Path(tmp), envoy, procs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_rows(result)
    print(f"ferry / nginx {result['ferry_over_nginx']}  (goal 0.8); nginx / direct {result['nginx_over_direct']}; "
          f"ferry / direct {result['ferry_over_direct']}; streamed: ferry / nginx "
          f"{result['ferry_stream_over_nginx_stream']}")
    if "envoy_over_nginx" in result:
        print(f"envoy / nginx {result['envoy_over_nginx']} (KServe unary), streamed envoy / nginx "
              f"{result['envoy_stream_over_nginx_stream']}; envoy / ferry {result['envoy_over_ferry']} unary, "
              f"{result['envoy_stream_over_ferry_stream']} streamed")
    if "ferry_workers_over_nginx_workers" in result:
        print(f"with {args.workers} workers each: ferry / nginx {result['ferry_workers_over_nginx_workers']}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
