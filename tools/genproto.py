"""Regenerate the Python stubs of the wire contract, or check that they are fresh.

The contract lives in ``proto/ferry/v1/*.proto``; the stubs (``*_pb2.py``,
``*_pb2.pyi`` and ``*_pb2_grpc.py``) are generated into ``ferry/v1/`` so that
their absolute imports (``from ferry.v1 import common_pb2``) resolve.

Usage::

    python -m tools.genproto           # write the stubs
    python -m tools.genproto --check   # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("ferry") / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every contract file into ``out_root``."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / PACKAGE_DIR).iterdir() if p.name.endswith(SUFFIXES))


def stale_files() -> list[str]:
    """Names of stub files that differ from a fresh generation, or are missing or extra."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        committed = {p.name: p for p in (ROOT / PACKAGE_DIR).iterdir() if p.name.endswith(SUFFIXES)}
        names = sorted(set(fresh) | set(committed))
        return [
            n for n in names
            if n not in fresh or n not in committed or not filecmp.cmp(fresh[n], committed[n], shallow=False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated stubs (run `python -m tools.genproto`): " + ", ".join(stale), file=sys.stderr)
            return 1
        print("generated stubs are fresh")
        return 0
    written = generate(ROOT)
    print("\n".join(str(p.relative_to(ROOT)) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
