"""Structured logs: one JSON object a line, named events, a rate limit per event name that says what it dropped."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

from ferry import logs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ('{"event": "drain_requested", "replica_id": "r1"}', {"event": "drain_requested", "replica_id": "r1"}),
        ("proxy p1 serving region local", {"msg": "proxy p1 serving region local"}),
        ("{not json", {"msg": "{not json"}),
        ("[1, 2]", {"msg": "[1, 2]"}),
    ],
    ids=["event", "plain", "broken-json", "json-not-object"],
)
def test_every_record_is_one_json_object(message: str, expected: dict[str, object]) -> None:
    record = logging.LogRecord("dataplane.api.service", logging.WARNING, __file__, 1, message, None, None)
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    body = json.loads(line)
    assert body["level"] == "WARNING" and body["logger"] == "dataplane.api.service" and body["ts"] > 0
    assert {k: body[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # (seconds to advance before the call) -> admitted (None) or dropped-count reported
        ([0, 0, 0], [0, 0, None]),             # a burst of 2, the third dropped
        ([0, 0, 0, 0, 0.5], [0, 0, None, None, 2]),  # after refill the next line reports the 2 dropped
        ([0, 0, 1.0, 0], [0, 0, 0, 0]),        # 1 s at 2/s refills to the burst
    ],
    ids=["burst", "suppressed-count", "refill"],
)
def test_each_event_name_is_rate_limited_and_counts_what_it_dropped(
        steps: list[float], expected: list[int | None]) -> None:
    clock = Clock()
    limiter = logs.EventLimiter(burst=2, rate=2.0, clock=clock)
    got = []
    for advance in steps:
        clock.now += advance
        got.append(limiter.admit("request_failed"))
    assert got == expected
    assert limiter.admit("other_event") == 0  # names have their own buckets


def test_an_event_carries_its_fields_and_the_dropped_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = logs.EventLimiter(burst=1, rate=1.0, clock=clock)
    log = logging.getLogger("test.events")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            logs.event(log, "replica_ejected", logging.WARNING, limiter=limiter, replica_id="r1", reason="latency")
        clock.now += 1.0
        logs.event(log, "replica_ejected", logging.WARNING, limiter=limiter, replica_id="r2", reason="failures")
    bodies = [json.loads(r.getMessage()) for r in caplog.records]
    assert bodies == [
        {"event": "replica_ejected", "replica_id": "r1", "reason": "latency"},
        {"event": "replica_ejected", "replica_id": "r2", "reason": "failures", "suppressed": 2},
    ]


def test_configure_writes_json_lines_or_text_and_refuses_other_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        checks = (("json", lambda s: json.loads(s)["msg"] == "hello"), ("text", lambda s: "INFO x: hello" in s))
        for fmt, check in checks:
            stream = io.StringIO()
            monkeypatch.setattr(sys, "stderr", stream)
            logs.configure("info", fmt)
            logging.getLogger("x").info("hello")
            assert check(stream.getvalue().strip()), stream.getvalue()
        with pytest.raises(ValueError, match="--log-format"):
            logs.configure("info", "xml")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_a_component_logs_json_lines_by_default() -> None:
    # A proxy with no control plane logs its start and its warning; every stderr line is a JSON object.
    proc = subprocess.Popen([sys.executable, "-m", "ferry", "proxy", "--insecure", "--listen", "127.0.0.1:0",
                             "--metrics-listen", "127.0.0.1:0", "--workers", "1"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    body = json.loads(first)
    assert body["level"] == "INFO" and "serving region" in body["msg"]
