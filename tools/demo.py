"""``make demo``: run ``ferry up``, replay the first minutes of a trace through it, print what happened.

Starts ``ferry up`` (one control plane, one proxy, four nodes with eight
simulated replicas of two models, each its own process), waits for its ready
file, shows ``ferryctl replicas``, sends one chat completion through Envoy
(the native data path: a picker decides, the replica's answer streams back
untouched) with the official ``openai`` client (:func:`openai_request`), replays the first ``--minutes`` of the
Mooncake conversation trace at ``--speedup`` with a progress bar (from
``traces/`` when ``python -m tools.fetch_traces`` put it there, else the
bundled excerpt of its first two minutes in ``tools/data``; the replay
names the file), prints the
report (also written to ``bench-results/demo.json``), shows the replicas again
and stops everything. Exits non-zero if any request failed.

While the trace replays, ``ferryctl board --watch`` (:func:`start_board`)
redraws the running fleet every :data:`BOARD_INTERVAL` seconds into
``bench-results/board.png`` (and ``board.svg``, ``board.dot``): the last
frame drawn under load is what stays.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.procs import Child, ChildFailed
from tools import replay
from tools.fetch_traces import default_trace, trace_file

ROOT = Path(__file__).resolve().parent.parent
TRACE = default_trace()  # traces/mooncake_conversation_trace.jsonl if fetched, else its bundled first 2 minutes
BOARD_INTERVAL = 5.0  # seconds between the board's frames during the replay
BOARD_OUT = ROOT / "bench-results"


def ferryctl(ready_file: Path, *args: str) -> None:
    """``ferryctl --ready-file READY ARGS…`` in its own process, its output on this one's."""
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", str(ready_file), *args], check=False,
                   cwd=ROOT)


def start_board(ready_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """``ferryctl board --watch`` in its own process (its frames' lines in ``log``), stopped by :func:`stop_board`."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", str(ready_file), "board",
                                 "--out", str(BOARD_OUT), "--watch", "--interval", str(BOARD_INTERVAL),
                                 "--title", "Ferry: make demo, replaying the trace"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def stop_board(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Stop the board by its PID (SIGTERM: it finishes the frame it draws) and say where its picture is."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    if proc.returncode == 0 and (BOARD_OUT / "board.png").exists():
        print(f"\nthe fleet's board, drawn under load: {BOARD_OUT / 'board.png'} ({lines[-1] if lines else ''})")
    else:
        print(f"\ndemo: ferryctl board exited {proc.returncode}: {lines[-1] if lines else 'no output'}",
              file=sys.stderr)


def openai_request(ready: dict[str, Any]) -> None:
    """One streamed chat completion with the ``openai`` client through Envoy (the native path: a picker decides,
    the replica's own HTTP answer streams back untouched), else the proxy's HTTP front door; prints it."""
    import openai  # the dev extra: the client services already use

    tenant, key = next(iter(ready["api_keys"].items()))
    model = ready["models"][-1]
    address = ready.get("envoy") or ready["http"]
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=key, max_retries=0, timeout=30)
    path = "Envoy, a picker deciding" if ready.get("envoy") else "the proxy's HTTP front door"
    print(f"openai client -> http://{address}/v1 through {path} (tenant {tenant}, model {model}):")
    stream = client.chat.completions.create(model=model, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Say hello to the river."}])
    text: list[str] = []
    usage: Any = None
    for chunk in stream:
        text.extend(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    print(f"  assistant: {''.join(text).strip()}")
    if usage is not None:
        print(f"  usage: {usage.prompt_tokens} prompt, {usage.completion_tokens} completion tokens\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", type=trace_file, default=str(TRACE))
    p.add_argument("--minutes", default="2")
    p.add_argument("--speedup", default="4")
    p.add_argument("--replicas", default="8")
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with tempfile.TemporaryDirectory(prefix="ferry-demo-") as tmp:
        workdir = Path(tmp)
        # The replay asks for the trace's output lengths: answers run to max_tokens, with no natural end.
        up = Child("up", ["up", "--replicas", args.replicas, "--answer-tokens", "0", "--workdir",
                          str(workdir / "fleet")], workdir).start()
        try:
            try:
                ready = up.wait_ready(90)
            except ChildFailed as exc:
                print(f"demo: ferry up failed: {exc}", file=sys.stderr)
                return 1
            print(f"ferry up is ready: data plane {ready['data_plane']}, control plane {ready['control_plane']}, "
                  f"{len(ready['replicas'])} replicas of {', '.join(ready['models'])}\n")
            ferryctl(up.ready_path, "replicas")
            print()
            openai_request(ready)
            board = start_board(up.ready_path, workdir / "board.log")
            try:
                code = replay.main(["--trace", args.trace, "--ready-file", str(up.ready_path),
                                    "--minutes", args.minutes, "--speedup", args.speedup,
                                    "--json-out", str(ROOT / "bench-results" / "demo.json"),
                                    "--plots", str(ROOT / "bench-results" / "demo")])
            finally:
                stop_board(board, workdir / "board.log")
            time.sleep(1.0)  # one telemetry interval: the table shows the fleet settled, not the last steps
            print("\nreplicas after the run (ferryctl replicas):")
            ferryctl(up.ready_path, "replicas")
            print(f"\nreport written to {ROOT / 'bench-results' / 'demo.json'}")
            return code
        finally:
            up.stop(timeout=15)


if __name__ == "__main__":
    sys.exit(main())
