"""Measure the CPU each Ferry process spends per 1,000 streamed requests, and optionally profile one of them.

Method: start a fleet, let it idle ``--idle-seconds`` (background CPU per
second: telemetry polls, table pushes), replay a bounded slice of a trace
with :mod:`tools.replay` (every request streamed and interactive, output
capped at ``--max-output``, at most ``--limit`` requests and
``--time-limit`` seconds), and read every process's CPU time,
``utime + stime`` of ``/proc/<pid>/stat`` (all threads, in clock ticks),
just before and just after the replay. The figure per process is
``cpu seconds / streamed requests × 1000``; the share of the machine is
``cpu seconds / wall seconds``. The replay client's own CPU (it synthesizes
the prompts) is read from ``getrusage(RUSAGE_CHILDREN)`` and shown apart.

Layouts (``--layout``):

- ``adopt`` (default, as the evaluation ran it): ``--replicas`` simulated
  replicas, each its own process started by this tool
  (:class:`agent.replica.server.SimulatedReplica` behind Triton's gRPC service and a
  Triton-format ``/metrics``), and ``ferry up --triton ADDRESS,METRICS_URL``
  once per replica: one agent process per replica, adopting it over KServe
  v2 as it would a real Triton server. Agent and replica CPU are apart.
- ``nodes``: ``ferry up --replicas N --replicas-per-node 1``: each node
  process is one agent and its replica together (the figure is their sum).

``--profile proxy|agent|controlplane`` also profiles that process (the
first agent for ``agent``) over the replay window: with py-spy when it is
found (on ``PATH``, beside the interpreter, or ``--py-spy PATH``; it
samples at ``--rate`` Hz without pausing the process, ``--nonblocking``,
only the thread holding the GIL, ``--gil``: Python's own CPU, not the
gRPC core's threads nor time blocked in ``epoll``),
otherwise with cProfile, switched on and off by SIGUSR2 through a
``sitecustomize`` hook put on the children's ``PYTHONPATH`` (the hook only
acts in the process whose command line is ``-m ferry ROLE``). It prints the
top ``--top`` functions by cumulative and by self share of the samples (or
of the profiled time) and writes them into the JSON. The profiled process
runs slower (cProfile: several times), so its CPU figure in the same run is
not comparable; measure without ``--profile``.

Writes ``bench-results/cpu.json`` (``--out``). Cost of the tool itself: one
``/proc`` read per process before and after; the replay client takes most
of a core while it sends.

Example::

    python -m tools.profile_cpu --limit 346 --speedup 4 --max-output 32
    python -m tools.profile_cpu --profile proxy
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import pstats
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.procs import cpu_seconds
from tools.fetch_traces import trace_file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "tools" / "data" / "mooncake_conversation_first2min.jsonl"
ROLES = {"proxy": "proxy", "controlplane": "controlplane", "agent": "node"}  # --profile -> ferry subcommand
HOOK_ENV = "FERRY_CPU_PROFILE_ROLE"
HOOK_OUT_ENV = "FERRY_CPU_PROFILE_OUT"

# The cProfile hook: imported at start-up by every child (PYTHONPATH), active only in the
# process whose command line is ``-m ferry ROLE``; SIGUSR2 switches profiling on, then off and dumps.
HOOK = '''
import os, signal, sys
def _ferry_cpu_profile_hook():
    role = os.environ.get("FERRY_CPU_PROFILE_ROLE", "")
    out = os.environ.get("FERRY_CPU_PROFILE_OUT", "")
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\\0")
    except OSError:
        return
    if not role or not out or "ferry" not in argv or argv.index("ferry") + 1 >= len(argv):
        return
    if argv[argv.index("ferry") + 1] != role:
        return
    import cProfile
    profiler = cProfile.Profile()
    state = {"on": False}
    def toggle(signum, frame):
        if not state["on"]:
            state["on"] = True
            profiler.enable()
        else:
            profiler.disable()
            state["on"] = False
            profiler.dump_stats(os.path.join(out, f"{role}-{os.getpid()}.prof"))
    signal.signal(signal.SIGUSR2, toggle)
_ferry_cpu_profile_hook()
'''


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.profile_cpu", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--layout", choices=("adopt", "nodes"), default="adopt",
                   help="adopt: replicas in their own processes behind ferry up --triton (default); "
                        "nodes: ferry up --replicas N --replicas-per-node 1")
    p.add_argument("--replicas", type=int, default=8, help="replicas (default 8)")
    p.add_argument("--trace", type=trace_file, default=str(DEFAULT_TRACE),
                   help="trace file (default: the bundled 2-minute slice)")
    p.add_argument("--minutes", type=float, default=2.0, help="replay the first minutes of the trace (default 2)")
    p.add_argument("--speedup", type=float, default=4.0, help="divide arrival times by this (default 4)")
    p.add_argument("--limit", type=int, default=346, help="at most this many requests (default 346)")
    p.add_argument("--max-output", type=int, default=32, help="cap on generated tokens per request (default 32)")
    p.add_argument("--time-limit", type=float, default=60.0, help="stop sending after this many seconds (default 60)")
    p.add_argument("--idle-seconds", type=float, default=5.0,
                   help="measure the idle fleet this long before the replay (default 5; 0: skip)")
    p.add_argument("--settle-seconds", type=float, default=3.0,
                   help="wait this long after readiness before measuring (default 3)")
    p.add_argument("--profile", choices=sorted(ROLES), help="also profile this process over the replay")
    p.add_argument("--profiler", choices=("auto", "py-spy", "cprofile"), default="auto")
    p.add_argument("--py-spy", dest="py_spy", help="path of the py-spy binary (default: found on PATH)")
    p.add_argument("--native", action="store_true",
                   help="py-spy: also sample C and Cython frames (--native; pauses the process at each sample)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second (default 200)")
    p.add_argument("--top", type=int, default=25, help="functions listed per ranking (default 25)")
    p.add_argument("--config", help="a ferry config file passed to ferry up")
    p.add_argument("--out", default="bench-results/cpu.json", help="JSON report (default bench-results/cpu.json)")
    p.add_argument("--keep", help="keep the workdir (logs, ready files) here instead of a temporary folder")
    p.add_argument("--serve-replica", metavar="READY_FILE", help=argparse.SUPPRESS)  # internal: one replica process
    return p.parse_args(argv)


# -- /proc ------------------------------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc's parent links."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu for name, pid in pids.items() if (cpu := cpu_seconds(pid)) is not None}


# -- a replica process (--serve-replica) ---------------------------------------------------------------------------


async def _serve_replica(ready_file: str) -> None:
    from agent.replica.server import SimulatedReplica
    from ferry.process import stop_event, write_ready_file

    stop = stop_event()
    async with SimulatedReplica("chat", "v1", replica_id=f"sim-{os.getpid()}") as replica:
        write_ready_file(ready_file, {"pid": os.getpid(), "address": replica.address,
                                      "metrics_url": replica.metrics_url})
        await stop.wait()


def serve_replica(ready_file: str) -> int:
    from ferry.process import die_with_parent

    if os.environ.get("FERRY_PARENT_PID", "").isdigit():
        die_with_parent(int(os.environ.pop("FERRY_PARENT_PID")))
    asyncio.run(_serve_replica(ready_file))
    return 0


# -- the fleet -----------------------------------------------------------------------------------------------------


def wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                data: dict[str, Any] = json.loads(path.read_text())
                return data
            except json.JSONDecodeError:
                pass
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before it was ready")
        time.sleep(0.1)
    raise SystemExit(f"{what} not ready after {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM to a process this tool started, then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Run:
    """One fleet: the replica processes (adopt layout) and ``ferry up``."""

    def __init__(self, args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> None:
        self.args, self.workdir, self.env = args, workdir, env
        self.replicas: list[subprocess.Popen[bytes]] = []
        self.up: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.pids: dict[str, int] = {}

    def start(self) -> None:
        args, work = self.args, self.workdir
        cmd = [sys.executable, "-m", "ferry", "up", "--models", "chat", "--ready-file", str(work / "up.json"),
               "--workdir", str(work / "up"), "--timeout", "90", "--answer-tokens", "0"]  # answers of max_tokens
        if args.config:
            cmd += ["--config", args.config]
        replica_pids: dict[str, int] = {}
        if args.layout == "adopt":
            env = {**os.environ, "FERRY_PARENT_PID": str(os.getpid()), "GRPC_VERBOSITY": "ERROR"}
            for i in range(args.replicas):
                ready = work / f"replica-{i + 1}.json"
                log = open(work / f"replica-{i + 1}.log", "wb")  # noqa: SIM115 - closed by the child's exit
                self.replicas.append(subprocess.Popen(
                    [sys.executable, "-m", "tools.profile_cpu", "--serve-replica", str(ready)],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
                log.close()
            for i, proc in enumerate(self.replicas):
                info = wait_file(work / f"replica-{i + 1}.json", proc, f"replica {i + 1}")
                cmd += ["--triton", f"{info['address']},{info['metrics_url']}"]
                replica_pids[f"replica-{i + 1}"] = proc.pid
            cmd += ["--replicas", "0"]
        else:
            cmd += ["--replicas", str(args.replicas), "--replicas-per-node", "1"]
        self.command = cmd
        with open(work / "up.log", "wb") as log:
            self.up = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=self.env)
        self.ready = wait_file(work / "up.json", self.up, "ferry up")
        self.pids = {"ferry-up": self.up.pid, **{n: int(p) for n, p in self.ready["pids"].items()}, **replica_pids}
        known = set(self.pids.values())
        for pid in children_of(self.up.pid):  # an etcd or any child the ready file does not name
            if pid not in known:
                self.pids[f"child-{pid}"] = pid

    def stop(self) -> None:
        if self.up is not None:
            stop(self.up)
        for proc in self.replicas:
            stop(proc, 10.0)


def group(name: str) -> str:
    """The kind of a process of the fleet by its ``ferry up`` name."""
    if name.startswith("controlplane"):
        return "controlplane"
    if name.startswith("proxy"):
        return "proxy"
    if name.startswith(("triton-", "node-", "batch-")):
        return "agent"
    if name.startswith("replica-"):
        return "replica"
    return "other"


# -- profiling -----------------------------------------------------------------------------------------------------


def find_py_spy(given: str | None) -> str | None:
    if given:
        return given
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def collapsed_ranking(path: Path, top: int) -> dict[str, Any]:
    """Cumulative and self shares per function from py-spy's raw (collapsed) stacks."""
    cumulative: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if f]
        if not frames:
            continue
        own[frames[-1]] += count
        for f in set(frames):
            cumulative[f] += count
    return {"samples": total,
            "cumulative": [(f, round(n / total, 4)) for f, n in cumulative.most_common(top)] if total else [],
            "self": [(f, round(n / total, 4)) for f, n in own.most_common(top)] if total else []}


def _frame(text: str) -> str:
    """``function (path:line)`` to ``function (short path)``: one entry per function, not per line."""
    name, _, where = text.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", str(ROOT) + "/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})" if where else name


def cprofile_ranking(paths: list[Path], top: int) -> dict[str, Any]:
    """Cumulative and self shares of profiled time per function from cProfile dumps."""
    stats = pstats.Stats(*(str(p) for p in paths))
    table: Any = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in table.values()) or 1.0

    def label(key: tuple[str, int, str]) -> str:
        file, line, name = key
        return _frame(f"{name} ({file}:{line})") if file != "~" else name

    rows = [(label(k), tt, ct, nc) for k, (_cc, nc, tt, ct, _callers) in table.items()]
    by_cum = sorted(rows, key=lambda r: r[2], reverse=True)[:top]
    by_self = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    return {"profiled_seconds": round(total, 3),
            "cumulative": [(f, round(ct / total, 4), nc) for f, _tt, ct, nc in by_cum],
            "self": [(f, round(tt / total, 4), nc) for f, tt, _ct, nc in by_self]}


def print_ranking(ranking: dict[str, Any]) -> None:
    for kind in ("cumulative", "self"):
        print(f"\ntop functions by {kind} share")
        for row in ranking[kind]:
            calls = f"  calls {row[2]}" if len(row) > 2 else ""
            print(f"  {row[1] * 100:6.2f}%  {row[0]}{calls}")


# -- the measurement -----------------------------------------------------------------------------------------------


def replay_command(args: argparse.Namespace, ready: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tools.replay", "--ready-file", str(ready), "--trace", args.trace,
            "--minutes", str(args.minutes), "--speedup", str(args.speedup), "--max-output", str(args.max_output),
            "--tiers", "interactive=1", "--stream-share", "1", "--models", "chat", "--limit", str(args.limit),
            "--time-limit", str(args.time_limit), "--json-out", str(out)]


def summarize_cpu(pids: dict[str, int], before: dict[str, float], after: dict[str, float], streamed: int,
                  wall: float) -> dict[str, Any]:
    per_1000 = 1000.0 / streamed if streamed else 0.0
    rows: dict[str, dict[str, Any]] = {}
    for name in pids:
        if name in before and name in after:
            cpu = after[name] - before[name]
            rows[name] = {"pid": pids[name], "group": group(name), "cpu_s": round(cpu, 3),
                          "per_1000": round(cpu * per_1000, 3), "cores": round(cpu / wall, 4) if wall else 0.0}
    groups: dict[str, dict[str, Any]] = {}
    for g in ("proxy", "controlplane", "agent", "replica", "other"):
        members = [r for r in rows.values() if r["group"] == g]
        if not members:
            continue
        cpu = float(sum(r["cpu_s"] for r in members))
        groups[g] = {"processes": len(members), "cpu_s": round(cpu, 3), "per_1000": round(cpu * per_1000, 3),
                     "per_1000_each": round(cpu * per_1000 / len(members), 3),
                     "cores": round(cpu / wall, 4) if wall else 0.0}
    return {"processes": rows, "groups": groups}


def print_table(result: dict[str, Any], streamed: int, wall: float, client_cpu: float) -> None:
    print(f"\nCPU over the replay: {streamed} streamed requests in {wall:.1f} s")
    print(f"{'process':<22}{'CPU s':>9}{'per 1,000':>12}{'cores':>8}")
    for name, row in result["processes"].items():
        print(f"{name:<22}{row['cpu_s']:>9.2f}{row['per_1000']:>12.2f}{row['cores']:>8.3f}")
    print(f"\n{'group':<22}{'CPU s':>9}{'per 1,000':>12}{'each':>8}{'cores':>8}")
    for name, g in result["groups"].items():
        label = f"{name} x{g['processes']}"
        print(f"{label:<22}{g['cpu_s']:>9.2f}{g['per_1000']:>12.2f}{g['per_1000_each']:>8.2f}{g['cores']:>8.3f}")
    ferry = sum(g["cpu_s"] for n, g in result["groups"].items() if n in ("proxy", "controlplane", "agent"))
    print(f"ferry (proxy, control plane, agents): {ferry / wall:.3f} cores; "
          f"replay client {client_cpu:.2f} CPU s ({client_cpu / wall:.3f} cores)")


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    env = {**os.environ, "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR")}
    profile_dir = workdir / "profiles"
    profiler = None
    if args.profile:
        profiler = "cprofile" if args.profiler == "cprofile" else ("py-spy" if find_py_spy(args.py_spy) else None)
        if profiler is None and args.profiler == "py-spy":
            raise SystemExit("py-spy not found: pip install py-spy, or give --py-spy PATH")
        profiler = profiler or "cprofile"
        if profiler == "cprofile":
            hook_dir = workdir / "hook"
            hook_dir.mkdir()
            (hook_dir / "sitecustomize.py").write_text(HOOK)
            profile_dir.mkdir()
            env.update({HOOK_ENV: ROLES[args.profile], HOOK_OUT_ENV: str(profile_dir),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH", "")]))})
    run = Run(args, workdir, env)
    try:
        run.start()
        print(f"fleet ready: {len(run.pids)} processes ({args.layout} layout)", flush=True)
        time.sleep(args.settle_seconds)
        idle: dict[str, Any] = {}
        if args.idle_seconds > 0:
            before, t0 = snapshot(run.pids), time.monotonic()
            time.sleep(args.idle_seconds)
            after, wall = snapshot(run.pids), time.monotonic() - t0
            idle = {name: round((after[name] - before[name]) / wall, 4) for name in before if name in after}
        target = next((n for n in run.pids if group(n) == ("agent" if args.profile == "agent" else args.profile)),
                      None) if args.profile else None
        spy: subprocess.Popen[bytes] | None = None
        raw = workdir / "py-spy.txt"
        if target is not None and profiler == "py-spy":
            mode = ["--native"] if args.native else ["--nonblocking"]  # native unwinding pauses the process
            with open(workdir / "py-spy.log", "wb") as spy_log:
                spy = subprocess.Popen([str(find_py_spy(args.py_spy)), "record", "--pid", str(run.pids[target]),
                                        "--rate", str(args.rate), "--format", "raw", "--output", str(raw), "--gil",
                                        *mode], stdout=spy_log, stderr=subprocess.STDOUT)
            time.sleep(1.0)
        elif target is not None:
            os.kill(run.pids[target], signal.SIGUSR2)
        report_path = workdir / "replay.json"
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        before, t0 = snapshot(run.pids), time.monotonic()
        subprocess.run(replay_command(args, workdir / "up.json", report_path), cwd=ROOT, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env | {"PYTHONPATH": str(ROOT)})
        after, wall = snapshot(run.pids), time.monotonic() - t0
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        ranking: dict[str, Any] | None = None
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
            ranking = collapsed_ranking(raw, args.top) if raw.exists() else None
        elif target is not None:
            os.kill(run.pids[target], signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not list(profile_dir.glob("*.prof")) and time.monotonic() < deadline:
                time.sleep(0.2)
            dumps = list(profile_dir.glob("*.prof"))
            ranking = cprofile_ranking(dumps, args.top) if dumps else None
    finally:
        run.stop()
    replay: dict[str, Any] = json.loads(report_path.read_text()) if report_path.exists() else {}
    streamed = int(replay.get("requests", 0))
    result = summarize_cpu(run.pids, before, after, streamed, wall)
    print_table(result, streamed, wall, client_cpu)
    if replay:
        print(f"replay: {replay['ok']} ok, {replay['errors']} errors {replay['errors_by_status']}, "
              f"TTFT p50 {replay['ttft'].get('p50_ms')} ms, p99 {replay['ttft'].get('p99_ms')} ms")
    if idle:
        print("idle CPU (cores): " + ", ".join(f"{n} {v:.3f}" for n, v in idle.items()))
    if ranking is not None:
        print(f"\nprofile of {target} ({profiler}), over the replay:")
        print_ranking(ranking)
    elif args.profile:
        print(f"\nno profile of {args.profile} was collected")
    return {"command": " ".join([Path(sys.executable).name, "-m", "tools.profile_cpu", *sys.argv[1:]]),
            "ferry_up": " ".join(run.command[1:]), "layout": args.layout, "replicas": args.replicas,
            "trace": Path(args.trace).name, "limit": args.limit, "speedup": args.speedup,
            "max_output": args.max_output, "streamed_requests": streamed, "ok": replay.get("ok", 0),
            "errors": replay.get("errors_by_status", {}), "wall_s": round(wall, 2),
            "replay_client_cpu_s": round(client_cpu, 3), "ttft_ms": replay.get("ttft", {}),
            "idle_cores": idle, **result, "profile": {"process": target, "profiler": profiler, **(ranking or {})}
            if args.profile else None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_replica:
        return serve_replica(args.serve_replica)
    if args.keep:
        workdir = Path(args.keep)
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        report = measure(args, workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="ferry-cpu-") as tmp:
            report = measure(args, Path(tmp))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if report["streamed_requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
