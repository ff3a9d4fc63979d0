"""Fetch the two public request traces the tools replay, pinned by commit and sha256.

::

    python -m tools.fetch_traces                 # download into traces/ (git-ignored)
    python -m tools.fetch_traces --check         # verify traces/ without the network
    python -m tools.fetch_traces --dir DIR       # another directory

The traces (docs/traces.md has their sources, formats, sizes and licences):

- ``mooncake_conversation_trace.jsonl``: the conversation trace of the FAST'25
  release of the public ``kvcache-ai/Mooncake`` repository
  (``FAST25-release/traces/conversation_trace.jsonl``, renamed with a
  ``mooncake_`` prefix), Apache License 2.0;
- ``AzureLLMInferenceTrace_conv.csv``: the conversation trace of the Azure LLM
  inference trace 2023 in the public ``Azure/AzurePublicDataset`` repository
  (``data/AzureLLMInferenceTrace_conv.csv``), CC BY 4.0.

Each file comes from a URL pinned to one commit, is read in chunks into
``NAME.part`` beside its final name with its size bounded by the pinned size,
and is moved into place only when its sha256 equals the pinned one; a mismatch
is refused with a message naming the file, and the partial copy is deleted.
A file already present with the pinned sha256 is not downloaded again.
``--check`` hashes what is there and names every file missing or different.

Every tool that replays a trace defaults to the bundled excerpt
``tools/data/mooncake_conversation_first2min.jsonl`` (the first two minutes of
the Mooncake trace) and says which trace it replays; :func:`trace_file` is the
``--trace`` argument type that turns a missing file into a clear error naming
this command.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = ROOT / "traces"
BUNDLED = ROOT / "tools" / "data" / "mooncake_conversation_first2min.jsonl"
CHUNK = 1 << 16
TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Trace:
    """One trace file: its name here, the pinned URL it comes from, its size and sha256."""

    name: str
    url: str
    size: int
    sha256: str


MOONCAKE = Trace(
    name="mooncake_conversation_trace.jsonl",
    url=("https://raw.githubusercontent.com/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/"
         "FAST25-release/traces/conversation_trace.jsonl"),
    size=3_029_533,
    sha256="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
)
AZURE = Trace(
    name="AzureLLMInferenceTrace_conv.csv",
    url=("https://raw.githubusercontent.com/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/"
         "data/AzureLLMInferenceTrace_conv.csv"),
    size=719_188,
    sha256="2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
)
TRACES: tuple[Trace, ...] = (MOONCAKE, AZURE)


class TraceError(Exception):
    """A trace file missing, of the wrong size, or not the pinned bytes; the message names the file."""


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, trace: Trace) -> None:
    """Raise :class:`TraceError` unless ``path`` holds exactly the pinned bytes of ``trace``."""
    if not path.is_file():
        raise TraceError(f"{trace.name}: missing at {path}; run `python -m tools.fetch_traces`")
    got = sha256_of(path)
    if got != trace.sha256:
        raise TraceError(f"{trace.name}: sha256 {got} at {path}, expected {trace.sha256}; "
                         "delete it and run `python -m tools.fetch_traces`")


def check(directory: Path, traces: Sequence[Trace] = TRACES) -> list[str]:
    """What is wrong with ``directory``: one message per trace missing or different (empty: all good)."""
    problems = []
    for trace in traces:
        try:
            verify(directory / trace.name, trace)
        except TraceError as exc:
            problems.append(str(exc))
    return problems


def download(trace: Trace, directory: Path, *, timeout: float = TIMEOUT_S) -> Path:
    """Download one trace into ``directory`` from its pinned URL; keep it only if its sha256 matches.

    Raises :class:`TraceError` naming the file when the source is unreachable,
    sends more than the pinned size, or sends other bytes; nothing is left
    behind then (neither the partial copy nor a wrong file).
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / trace.name
    part = directory / f"{trace.name}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(trace.url, timeout=timeout) as response, part.open("wb") as out:
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > trace.size:
                    raise TraceError(f"{trace.name}: {trace.url} sent more than the pinned {trace.size} bytes; "
                                     "refused")
                digest.update(chunk)
                out.write(chunk)
        got = digest.hexdigest()
        if got != trace.sha256:
            raise TraceError(f"{trace.name}: sha256 mismatch: got {got} ({size} bytes) from {trace.url}, "
                             f"expected {trace.sha256}; refused, nothing written")
        os.replace(part, final)
    except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
        raise TraceError(f"{trace.name}: cannot download {trace.url}: {exc}") from exc
    finally:
        part.unlink(missing_ok=True)
    return final


def fetch(directory: Path, traces: Sequence[Trace] = TRACES, *, timeout: float = TIMEOUT_S) -> list[str]:
    """Bring every trace into ``directory``: one line per trace (kept or downloaded); raises on the first failure."""
    lines = []
    for trace in traces:
        path = directory / trace.name
        if path.is_file() and sha256_of(path) == trace.sha256:
            lines.append(f"ok          {path} (sha256 {trace.sha256}, already there)")
            continue
        download(trace, directory, timeout=timeout)
        lines.append(f"downloaded  {path} (sha256 {trace.sha256})")
    return lines


def trace_file(text: str) -> str:
    """The ``--trace`` argument type: the path as given if it is a file, else a clear error naming the way out."""
    if Path(text).is_file():
        return text
    raise argparse.ArgumentTypeError(
        f"no trace file at {text}: run `python -m tools.fetch_traces` to download the public traces into "
        f"{TRACES_DIR.relative_to(ROOT)}/, or leave --trace out to replay the bundled excerpt "
        f"{BUNDLED.relative_to(ROOT)}")


def default_trace() -> Path:
    """The full Mooncake trace when ``traces/`` holds it, else the bundled excerpt (its first two minutes)."""
    full = TRACES_DIR / MOONCAKE.name
    return full if full.is_file() else BUNDLED


def main(argv: Sequence[str] | None = None, *, traces: Sequence[Trace] = TRACES) -> int:
    """Download (default) or ``--check`` the traces; 0 when every file is there with its pinned sha256."""
    p = argparse.ArgumentParser(prog="tools.fetch_traces", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--dir", default=str(TRACES_DIR), help="where the traces go (default: traces/ at the repo root)")
    p.add_argument("--check", action="store_true", help="verify the directory's files against the pinned sha256, "
                                                        "without the network")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per download without progress")
    args = p.parse_args(argv)
    directory = Path(args.dir)
    if args.check:
        problems = check(directory, traces)
        for trace in traces:
            if not any(msg.startswith(f"{trace.name}:") for msg in problems):
                print(f"ok  {directory / trace.name} (sha256 {trace.sha256})")
        for msg in problems:
            print(f"fetch_traces: {msg}", file=sys.stderr)
        return 1 if problems else 0
    try:
        for line in fetch(directory, traces, timeout=args.timeout):
            print(line)
    except TraceError as exc:
        print(f"fetch_traces: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
