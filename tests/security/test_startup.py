"""Every component refuses to start without TLS files or an explicit ``--insecure`` (exit 2, a clear message)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.batch.main import main as batch_main
from agent.main import main as node_main
from controlplane.main import main as controlplane_main
from dataplane.main import main as proxy_main

MAINS: list[tuple[str, Callable[[list[str] | None], int], list[str], str]] = [
    ("controlplane", controlplane_main, [], "ferry controlplane:"),
    ("proxy", proxy_main, [], "ferry proxy:"),
    ("node", node_main, ["--control-plane", "127.0.0.1:1"], "ferry node:"),
    ("batch-runtime", batch_main, [], "ferry batch-runtime:"),
]
CASES = [
    ("neither", [], "or --insecure"),
    ("partial", ["--tls-ca", "ca.pem"], "--tls-cert"),
    ("both", ["--insecure", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"], "not both"),
    ("unreadable", ["--tls-ca", "/nonexistent/ca.pem", "--tls-cert", "/nonexistent/c.pem", "--tls-key",
                    "/nonexistent/c.key"], "cannot read /nonexistent/ca.pem"),
]


@pytest.mark.parametrize(("main", "base", "prefix"), [m[1:] for m in MAINS], ids=[m[0] for m in MAINS])
@pytest.mark.parametrize(("flags", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_component_refuses_to_start_without_tls_or_insecure(
        main: Callable[[list[str] | None], int], base: list[str], prefix: str, flags: list[str], text: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_JOIN_TOKEN", raising=False)
    assert main([*base, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(prefix) and text in err, err
