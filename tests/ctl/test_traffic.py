"""``ferryctl traffic export``'s pure parts: the duration, the trace layout that tools.trace.load reads, the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferry.v1 import tables_pb2
from ferry_cli.ctl.main import build_parser
from ferry_cli.ctl.traffic import KEYS, parse_duration, summary, trace_lines
from tools.trace import load


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90.0), ("30m", 1800.0), ("1h", 3600.0), ("2d", 172800.0),
                                               ("45", 45.0), ("1.5h", 5400.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1w", "-1h", "0s", "1 hour"])
def test_bad_durations_name_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="90s, 30m, 1h or 2d"):
        parse_duration(text)


def test_the_parser_refuses_a_bad_since(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["traffic", "export", "--since", "soon"])
    assert "--since" in capsys.readouterr().err
    args = build_parser().parse_args(["traffic", "export", "--since", "1h", "--model", "m", "-o", "x.jsonl"])
    assert (args.since, args.model, args.output, args.max_rows) == (3600.0, "m", "x.jsonl", 0)


def test_the_export_is_a_trace_tools_trace_reads(tmp_path: Path) -> None:
    rows = [tables_pb2.TrafficRow(arrival=100.5, model="m", prompt_tokens=700, completion_tokens=9,
                                  hash_ids=[7, 2**64 - 1], e2e_seconds=1.25, proxy_id="p2"),
            tables_pb2.TrafficRow(arrival=100.0, model="m", prompt_tokens=10, completion_tokens=3, hash_ids=[5],
                                  ttft_seconds=0.0421, e2e_seconds=0.5, proxy_id="p1", streamed=True)]
    lines = trace_lines(rows)
    assert [list(line) for line in lines] == [list(KEYS)] * 2
    assert [(x["timestamp"], x["input_length"], x["ttft_ms"]) for x in lines] == [(0, 10, 42.1), (500, 700, None)]
    assert lines[1]["e2e_ms"] == 1250.0 and lines[1]["hash_ids"] == [7, 2**64 - 1]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = load(path)
    assert [(t.offset, t.input_tokens, t.output_tokens, t.hash_ids) for t in trace] == [
        (0.0, 10, 3, (5,)), (0.5, 700, 9, (7, 2**64 - 1))]
    said = summary(lines, 4, True)
    assert "2 rows from 2 proxies" in said and "(0.5 s)" in said and "4 rows dropped" in said and "max-rows" in said
    assert summary([], 0, False).startswith("exported no rows")
