"""Random and malformed requests at the HTTP front door of a real ``ferry proxy`` process.

Every answer is a 4xx (or a 200 for a request that happens to be valid) in OpenAI's error shape naming
the field; the proxy still serves afterwards; its resident memory stays bounded through huge bodies,
header floods and thousands of cases.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.procs import Child
from ferry_cli.up.ready import wait_routable
from tools.process_fleet import Fleet

SETTINGS = settings(max_examples=500, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PATHS = ("/v1/completions", "/v1/chat/completions")
NAMED = {"body", "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
         "stream_options.include_usage", "temperature", "top_p", "top_k", "stop", "seed", "presence_penalty",
         "frequency_penalty", "n", "user", "echo", "logprobs", "suffix", "best_of", "x-ferry-tier",
         "x-ferry-timeout", "content-type", "x-request-id", "version"}


class HttpProxy:
    """A ``ferry proxy`` with ``--http-listen`` watching the fuzz fleet's control plane."""

    def __init__(self, fleet: Fleet, workdir: Path) -> None:
        self.child = Child("proxy-http", ["proxy", "--control-plane", fleet.cp_address, "--id", "proxy-http",
                                          "--http-listen", "127.0.0.1:0", "--config", str(fleet.config_path),
                                          "--insecure", "--workers", "1"], workdir).start()
        ready = self.child.wait_ready()
        wait_routable(fleet.cp_address, fleet.replica_ids(), "proxy-http", 30, [], admin_token=fleet.admin_token)
        host, _, port = ready["http"].rpartition(":")
        self.host, self.port = host, int(port)
        self.key = fleet.keys["ent"]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.child.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                ) -> tuple[int, bytes, dict[str, str]]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
        try:
            conn.request(method, path, body=body, headers={"Authorization": f"Bearer {self.key}",
                                                           "Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def raw(self, data: bytes) -> bytes:
        """Send ``data`` as is on a fresh connection; the first bytes of the answer."""
        with socket.create_connection((self.host, self.port), timeout=15) as sock:
            sock.sendall(data)
            return sock.recv(4096)


@pytest.fixture(scope="module")
def proxy(fuzz_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpProxy]:
    run = HttpProxy(fuzz_fleet, tmp_path_factory.mktemp("http-fuzz"))
    try:
        yield run
    finally:
        run.child.stop()


def check(status: int, body: bytes, headers: dict[str, str]) -> str:
    """A fitting answer: 200, or a 4xx whose JSON error names the field; returns the status as a label."""
    assert headers.get("x-request-id"), headers
    if status == 200:
        return "200"
    assert 400 <= status < 500, (status, body[:300])
    error = json.loads(body)["error"]
    assert error["message"] and error["type"]
    if status == 400:
        assert error["param"] in NAMED or str(error["param"]).startswith(("messages[", "stop[")), error
    return str(status)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["chat", "user", "", "x" * 5000]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=12)
keys = st.sampled_from(["model", "prompt", "messages", "max_tokens", "stream", "temperature", "top_p", "top_k",
                        "stop", "seed", "presence_penalty", "frequency_penalty", "n", "stream_options", "user",
                        "logprobs", "echo", "unknown_field", "max_completion_tokens"])
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "robot", 3]),
                                           "content": st.one_of(st.text(max_size=40), values)}), max_size=3)
bodies = st.builds(lambda base, extra: {**base, **extra},
                   st.fixed_dictionaries({"model": st.sampled_from(["chat", "chat", "nope", 7]),
                                          "prompt": st.text(max_size=40), "messages": messages,
                                          "max_tokens": st.integers(-1, 20)}),
                   st.dictionaries(keys, values, max_size=4))


@SETTINGS
@given(body=bodies, path=st.sampled_from(PATHS), tier=st.sampled_from(["", "interactive", "batch", "gold"]))
def test_json_of_wrong_types_is_refused_naming_the_field(proxy: HttpProxy, body: dict[str, Any], path: str,
                                                         tier: str) -> None:
    status, raw, headers = proxy.request("POST", path, json.dumps(body).encode(),
                                         {"x-ferry-tier": tier} if tier else None)
    check(status, raw, headers)


@SETTINGS
@given(payload=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                         st.just(b"\xff\xfe\xfd"), st.just(b'{"model": "chat", "prompt": "\xc3\x28"}'),
                         st.just(b"[" * 100_000), st.just(b'{"a":' * 5000)))
def test_malformed_bodies_are_400_naming_body(proxy: HttpProxy, payload: bytes) -> None:
    status, raw, headers = proxy.request("POST", "/v1/completions", payload)
    assert check(status, raw, headers) != "200"


def refused(answer: bytes, what: bytes) -> None:
    """The HTTP parser's own refusal (before any handler, aiohttp's plain text): a 4xx naming the bound passed."""
    assert re.match(rb"HTTP/1\.[01] 4\d\d ", answer), answer[:200]
    assert what in answer.lower(), answer[:300]


def test_huge_bodies_headers_and_lines_are_refused_and_memory_stays_bounded(proxy: HttpProxy) -> None:
    before = proxy.rss_kib()
    for _ in range(5):
        status, raw, _ = proxy.request("POST", "/v1/completions", b"x" * (9 * 1024 * 1024))
        assert status == 413 and json.loads(raw)["error"]["param"] == "body"
    flood = "".join(f"X-Flood-{i}: {'v' * 50}\r\n" for i in range(500))
    refused(proxy.raw(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{flood}Content-Length: 0\r\n\r\n".encode()),
            b"headers")
    refused(proxy.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 20_000 + b"\r\n\r\n"),
            b"more than 8190 bytes")
    refused(proxy.raw(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"), b"more than 8190 bytes")
    for _ in range(200):  # an unread body would be held: each is answered and dropped
        status, raw, headers = proxy.request("POST", "/v1/chat/completions", b'{"model": "chat"' + b" " * 100_000)
        check(status, raw, headers)
    grown = proxy.rss_kib() - before
    assert grown < 64 * 1024, f"resident memory grew by {grown} KiB"
    status, raw, headers = proxy.request("POST", "/v1/completions",
                                         json.dumps({"model": "chat", "prompt": "still up", "max_tokens": 2}).encode())
    assert status == 200, raw  # the proxy still serves
    assert proxy.child.alive()
