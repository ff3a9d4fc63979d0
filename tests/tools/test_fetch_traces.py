"""tools.fetch_traces: pinned downloads verified by sha256, over file:// and a local HTTP server."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import fetch_traces
from tools.fetch_traces import Trace

BODY = b'{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n' * 50


def _trace(name: str, url: str, body: bytes = BODY) -> Trace:
    return Trace(name=name, url=url, size=len(body), sha256=hashlib.sha256(body).hexdigest())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A directory of fixtures served over HTTP on 127.0.0.1; yields the base URL."""
    root = tmp_path / "served"
    root.mkdir()
    (root / "trace.jsonl").write_bytes(BODY)
    (root / "tampered.jsonl").write_bytes(BODY[:-2] + b"]\n")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_pinned_traces_are_the_real_files() -> None:
    names = {t.name for t in fetch_traces.TRACES}
    assert names == {"mooncake_conversation_trace.jsonl", "AzureLLMInferenceTrace_conv.csv"}
    for t in fetch_traces.TRACES:
        assert t.url.startswith("https://raw.githubusercontent.com/")
        commit = t.url.split("/")[5]
        assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), t.url
        assert len(t.sha256) == 64
    assert fetch_traces.BUNDLED.is_file()


def test_downloads_over_http_then_checks_without_network(served: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    traces = [_trace("a.jsonl", f"{served}/trace.jsonl")]
    out = tmp_path / "traces"
    assert fetch_traces.main(["--dir", str(out)], traces=traces) == 0
    assert (out / "a.jsonl").read_bytes() == BODY
    assert not (out / "a.jsonl.part").exists()
    assert "downloaded" in capsys.readouterr().out
    # Already there with the pinned sha256: not fetched again (the URL no longer answers).
    gone = [dataclasses.replace(traces[0], url=f"{served}/missing.jsonl")]
    assert fetch_traces.main(["--dir", str(out)], traces=gone) == 0
    assert "already there" in capsys.readouterr().out
    assert fetch_traces.main(["--dir", str(out), "--check"], traces=gone) == 0


def test_downloads_from_a_file_url(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_bytes(BODY)
    path = fetch_traces.download(_trace("b.jsonl", src.as_uri()), tmp_path / "out")
    assert path.read_bytes() == BODY


def test_sha256_mismatch_is_refused_naming_the_file(served: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bad = _trace("mooncake_conversation_trace.jsonl", f"{served}/tampered.jsonl")  # pinned BODY, served other bytes
    out = tmp_path / "traces"
    assert fetch_traces.main(["--dir", str(out)], traces=[bad]) == 1
    err = capsys.readouterr().err
    assert "mooncake_conversation_trace.jsonl: sha256 mismatch" in err and bad.sha256 in err
    assert list(out.iterdir()) == []  # neither the file nor its partial copy


def test_oversized_and_unreachable_sources_are_refused(served: str, tmp_path: Path) -> None:
    small = dataclasses.replace(_trace("c.jsonl", f"{served}/trace.jsonl"), size=len(BODY) - 1)
    with pytest.raises(fetch_traces.TraceError, match=r"c\.jsonl: .* more than the pinned"):
        fetch_traces.download(small, tmp_path)
    with pytest.raises(fetch_traces.TraceError, match=r"d\.jsonl: cannot download"):
        fetch_traces.download(_trace("d.jsonl", f"{served}/missing.jsonl"), tmp_path)
    assert list(tmp_path.glob("*.jsonl*")) == []


def test_check_names_missing_and_different_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, other = _trace("good.jsonl", "file:///nowhere"), _trace("other.csv", "file:///nowhere")
    (tmp_path / "good.jsonl").write_bytes(BODY)
    assert fetch_traces.main(["--dir", str(tmp_path), "--check"], traces=[good, other]) == 1
    captured = capsys.readouterr()
    assert "good.jsonl" in captured.out
    assert "other.csv: missing" in captured.err and "python -m tools.fetch_traces" in captured.err
    (tmp_path / "other.csv").write_bytes(b"x")
    assert fetch_traces.check(tmp_path, [good, other])[0].startswith("other.csv: sha256 ")


def test_trace_argument_says_how_to_get_a_missing_trace(tmp_path: Path) -> None:
    assert fetch_traces.trace_file(str(fetch_traces.BUNDLED)) == str(fetch_traces.BUNDLED)
    with pytest.raises(argparse.ArgumentTypeError, match=r"python -m tools\.fetch_traces"):
        fetch_traces.trace_file(str(tmp_path / "nope.jsonl"))
