"""Run one real Triton Inference Server (through pytriton) with Ferry's test models, on the CPU.

Runs under the Triton environment's interpreter (``.venv-triton/bin/python``,
built by ``tools/triton/setup_env.sh``), never the main one: pytriton forces
numpy<2. It starts the tritonserver 2.51 that pytriton bundles, with the Python
backend, bound to 127.0.0.1 on the ports given, and serves:

- ``batchstring``: the fixed-batch contract model. ``text_input`` BYTES in,
  ``text_output`` BYTES out, one output per input in order, about
  ``--batch-seconds`` (0.1 s) per batch whatever its size; Triton's dynamic
  batcher with ``max_batch_size`` 100 and ``--max-queue-delay-us`` (50 ms).
- ``llm``: a decoupled model in the LLM convention (``text_input`` BYTES,
  ``max_tokens`` INT32, optional ``stream`` BOOL; ``text_output`` BYTES): one
  response per generated word when ``stream`` is true, one with the whole text
  otherwise, then Triton's empty final response. Triton refuses unary
  ``ModelInfer`` on a decoupled model, so:
- ``llm-unary``: the same inputs and outputs, not decoupled: unary ``ModelInfer``
  answers the whole text.

What the models compute is in ``tools/triton/textgen.py``. Once the server
answers ServerReady and every model is ready, the ready file is written
atomically: ``{"grpc": "127.0.0.1:P", "http": "127.0.0.1:H", "metrics":
"http://127.0.0.1:M/metrics", "pid", "tritonserver_pid", "models",
"startup_seconds"}``. SIGTERM and SIGINT stop the server and its tritonserver
child (which also gets SIGTERM from the kernel if this process dies).

Usage::

    .venv-triton/bin/python tools/triton/serve.py --grpc-port 8001 --http-port 8000 \\
        --metrics-port 8002 --ready-file /tmp/triton.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.triton import textgen

HOST = "127.0.0.1"
BATCHSTRING = "batchstring"
LLM = "llm"
LLM_UNARY = "llm-unary"
MODELS = (BATCHSTRING, LLM, LLM_UNARY)
MAX_BATCH_SIZE = 100
LLM_UNARY_MAX_BATCH = 64
READY_DEADLINE_S = 120.0

LOG = logging.getLogger("ferry.triton.serve")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line: three ports (tritonserver takes no port 0), a ready file, model timings."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--ready-file", type=Path, default=None, help="JSON written once every model is ready")
    parser.add_argument("--workspace", type=Path, default=None, help="pytriton workspace; must not exist yet")
    parser.add_argument("--batch-seconds", type=float, default=0.1, help="time per batchstring batch")
    parser.add_argument("--max-queue-delay-us", type=int, default=50_000, help="batchstring dynamic batcher delay")
    parser.add_argument("--token-seconds", type=float, default=0.01, help="time per generated word of the llm models")
    parser.add_argument("--exit-timeout-secs", type=int, default=3, help="tritonserver's grace period on stop")
    parser.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tritonserver --metrics-config, repeatable (e.g. summary_latencies=true)",
    )
    parser.add_argument("--verbose", action="store_true", help="log pytriton at INFO and echo tritonserver's log")
    return parser.parse_args(argv)


def ensure_libpython_on_library_path() -> str:
    """Put this interpreter's LIBDIR first on LD_LIBRARY_PATH, for the children to inherit.

    The Python backend stub that tritonserver spawns links libpython dynamically;
    without this it loads the system's libpython, which does not match this
    interpreter, and fails with ``'_thread.RLock' object has no attribute
    '_recursion_count'``. Only the children need it (pytriton copies
    ``os.environ`` into tritonserver's environment), so no re-exec is needed.
    """
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if libdir and (not parts or parts[0] != libdir):
        os.environ["LD_LIBRARY_PATH"] = ":".join([libdir, *[p for p in parts if p != libdir]])
    return libdir


def _text(value: Any) -> str:
    """One BYTES element as text (pytriton hands bytes, numpy bytes or str)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _first(request: Any, name: str, default: Any = None) -> Any:
    """The first element of input ``name`` of a pytriton request, or ``default`` when absent."""
    if name not in request:
        return default
    return request[name].reshape(-1)[0]


def bind_models(triton: Any, args: argparse.Namespace) -> None:
    """Bind ``batchstring``, ``llm`` (decoupled) and ``llm-unary`` to the pytriton server."""
    import numpy as np
    from pytriton.decorators import batch  # type: ignore[import-not-found]
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # type: ignore[import-not-found]

    batch_seconds = args.batch_seconds
    token_seconds = args.token_seconds

    @batch  # type: ignore[untyped-decorator]
    def infer_batchstring(text_input: Any) -> dict[str, Any]:
        """One batch: a fixed pause whatever the size, then one output per input in order."""
        time.sleep(batch_seconds)  # the model's fixed cost; this instance runs one batch at a time
        outputs = textgen.batchstring([_text(v) for v in text_input.reshape(-1)])
        return {"text_output": np.array([[o.encode()] for o in outputs], dtype=np.object_)}

    def _words(request: Any) -> list[str]:
        return textgen.generate_words(_text(_first(request, "text_input", b"")), int(_first(request, "max_tokens", 0)))

    def _output(text: str) -> dict[str, Any]:
        return {"text_output": np.array([[text.encode()]], dtype=np.object_)}

    async def infer_llm(requests: list[Any]) -> AsyncIterator[list[dict[str, Any]]]:
        """Decoupled: with batching off, Triton hands one request per call; stream or answer once."""
        if len(requests) != 1:
            raise ValueError(f"llm expects one request per call, got {len(requests)}")
        request = requests[0]
        words = _words(request)
        if bool(_first(request, "stream", False)):
            for chunk in textgen.stream_chunks(words):
                await asyncio.sleep(token_seconds)
                yield [_output(chunk)]
        else:
            await asyncio.sleep(token_seconds * len(words))
            yield [_output(textgen.unary_text(words))]

    async def infer_llm_unary(requests: list[Any]) -> list[dict[str, Any]]:
        """Not decoupled: the whole text for each request of the batch, after the time the longest would take."""
        results = [_words(r) for r in requests]
        await asyncio.sleep(token_seconds * max((len(w) for w in results), default=0))
        return [_output(textgen.unary_text(w)) for w in results]

    def llm_tensors(shape: tuple[int, ...]) -> tuple[list[Any], list[Any]]:
        inputs = [
            Tensor(name="text_input", dtype=bytes, shape=shape),
            Tensor(name="max_tokens", dtype=np.int32, shape=shape),
            Tensor(name="stream", dtype=np.bool_, shape=shape, optional=True),
        ]
        return inputs, [Tensor(name="text_output", dtype=bytes, shape=shape)]

    triton.bind(
        model_name=BATCHSTRING,
        infer_func=infer_batchstring,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
        config=ModelConfig(
            max_batch_size=MAX_BATCH_SIZE,
            batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
        ),
    )
    # Decoupled, no batching: one request per call; calls overlap, since execute() returns at once.
    inputs, outputs = llm_tensors((-1, 1))
    triton.bind(
        model_name=LLM,
        infer_func=infer_llm,
        inputs=inputs,
        outputs=outputs,
        config=ModelConfig(batching=False, decoupled=True),
    )
    # Not decoupled: execute() blocks, so requests that arrive meanwhile are batched (no added delay).
    # Metadata shapes are [-1, 1] either way, as for a TensorRT-LLM ensemble.
    inputs, outputs = llm_tensors((1,))
    triton.bind(
        model_name=LLM_UNARY,
        infer_func=infer_llm_unary,
        inputs=inputs,
        outputs=outputs,
        config=ModelConfig(max_batch_size=LLM_UNARY_MAX_BATCH, batcher=DynamicBatcher()),
    )


def wait_until_ready(grpc_url: str, deadline_s: float) -> None:
    """Poll ServerReady and ModelReady of every model over gRPC until all answer true, or raise TimeoutError."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=grpc_url)
    try:
        end = time.monotonic() + deadline_s
        while True:
            try:
                if client.is_server_ready(client_timeout=2.0) and all(
                    client.is_model_ready(m, client_timeout=2.0) for m in MODELS
                ):
                    return
            except Exception as exc:  # not up yet: any transport error means "poll again"
                LOG.debug("not ready yet: %s", exc)
            if time.monotonic() > end:
                raise TimeoutError(f"Triton at {grpc_url} not ready within {deadline_s:.0f} s")
            time.sleep(0.1)  # poll interval of a bounded readiness loop
    finally:
        client.close()


def write_ready_file(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _tritonserver_pid(triton: Any) -> int | None:
    """The tritonserver child's pid (pytriton keeps it private; None if its layout changes)."""
    try:
        return int(triton._triton_server._tritonserver_running_cmd.pid)
    except AttributeError:
        return None


def _server_logs(triton: Any) -> str:
    try:
        return str(triton._triton_server.logs())
    except AttributeError:
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Start the server, write the ready file, serve until SIGTERM or SIGINT; 0 on a clean stop."""
    started = time.monotonic()
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    ensure_libpython_on_library_path()

    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        LOG.info("signal %d: stopping", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)

    from pytriton.triton import (  # type: ignore[import-not-found]
        Triton,
        TritonConfig,
        TritonLifecyclePolicy,
        TritonSecurityConfig,
    )

    config = TritonConfig(
        grpc_address=HOST,
        grpc_port=args.grpc_port,
        http_address=HOST,
        http_port=args.http_port,
        metrics_address=HOST,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
        allow_cpu_metrics=True,
        metrics_config=list(args.metrics_config) or None,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=1 if args.verbose else 0,
    )
    workspace = args.workspace or Path(tempfile.mkdtemp(prefix="ferry-triton-")) / "workspace"
    # No restricted endpoints: statistics and repository index must answer without a token (loopback only).
    # Models are written into the workspace's model repository before tritonserver starts (a local model
    # store), so that RepositoryIndex lists them, as it does on a production server.
    triton = Triton(
        config=config,
        workspace=workspace,
        triton_lifecycle_policy=TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=True),
        security_config=TritonSecurityConfig(restricted_endpoints=[]),
    )
    try:
        bind_models(triton, args)
        triton.run()
        grpc_addr = f"{HOST}:{args.grpc_port}"
        wait_until_ready(grpc_addr, max(1.0, READY_DEADLINE_S - (time.monotonic() - started)))
        startup = time.monotonic() - started
        if stop.is_set():
            return 0
        payload = {
            "grpc": grpc_addr,
            "http": f"{HOST}:{args.http_port}",
            "metrics": f"http://{HOST}:{args.metrics_port}/metrics",
            "pid": os.getpid(),
            "tritonserver_pid": _tritonserver_pid(triton),
            "models": list(MODELS),
            "startup_seconds": round(startup, 3),
        }
        if args.ready_file:
            write_ready_file(args.ready_file, payload)
        print(f"serve.py: Triton ready in {startup:.2f} s on {grpc_addr}", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            if not triton.is_alive():
                print("serve.py: tritonserver exited on its own", file=sys.stderr, flush=True)
                print(_server_logs(triton)[-4000:], file=sys.stderr, flush=True)
                return 1
        return 0
    except Exception:
        print(_server_logs(triton)[-4000:], file=sys.stderr, flush=True)
        raise
    finally:
        triton.stop()


if __name__ == "__main__":
    sys.exit(main())
