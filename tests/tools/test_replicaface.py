"""The simulated replica's HTTP face (tools.peers.replicaface) over real loopback, with a plain asyncio client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.grpc.aio as triton

from agent.replica import tensors
from agent.replica.server import SimulatedReplica
from tests.agent.helpers import FAST, llm_inputs, params_of, text_of, until, with_natural
from tools.peers.replicaface import EOS_TOKEN_ID, HttpFace, token_ids
from tools.peers.replicas import start_replicas, stop_replicas

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The ``data:`` payloads of a server-sent event body."""
        return [block.removeprefix("data: ") for block in self.body.decode().split("\n\n") if block]


def _request_bytes(method: str, path: str, body: bytes | dict | None, headers: dict[str, str] | None,
                   close: bool = True) -> bytes:
    data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    lines = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    return int(head[0].split(" ")[1]), headers


async def _read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
    data = await reader.readexactly(size)
    await reader.readexactly(2)
    return data


async def _read_response(reader: asyncio.StreamReader) -> Response:
    status, headers = await _read_head(reader)
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while chunk := await _read_chunk(reader):
            body += chunk
    else:
        body = await reader.readexactly(int(headers["content-length"]))
    return Response(status, headers, body)


async def call(port: int, method: str, path: str, body: bytes | dict | None = None,
               headers: dict[str, str] | None = None) -> Response:
    """One request on a fresh connection, closed after the response."""
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_request_bytes(method, path, body, headers))
            return await _read_response(reader)
        finally:
            writer.close()


async def open_stream(port: int, path: str, body: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a streamed request and read the response head; the events are then read one chunk at a time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request_bytes("POST", path, body, None))
    status, headers = await asyncio.wait_for(_read_head(reader), 5)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    return reader, writer


@pytest.fixture
async def replica():
    async with SimulatedReplica("chat", "v1", params=FAST, replica_id="r0", face=HttpFace) as rep:
        yield rep


@pytest.fixture
def port(replica) -> int:
    return replica.http_port


def generate_body(text: str, max_new_tokens: int, **extra) -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}, **extra}


def words(count: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


# -- health and metadata ------------------------------------------------------------------------------------------


async def test_health_and_metadata_name_the_model_and_no_tokenizer_path(port):
    for path in ("/health", "/health_generate"):
        response = await call(port, "GET", path)
        assert response.status == 200 and response.json() == {}
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        info = (await call(port, "GET", path)).json()
        assert info["served_model_name"] == "chat"
        assert "model_path" not in info and "tokenizer_path" not in info
    models = (await call(port, "GET", "/v1/models")).json()
    assert models["data"][0]["id"] == "chat" and models["data"][0]["max_model_len"] == FAST.max_context_tokens


async def test_off_by_default_and_http_url_names_the_face():
    async with SimulatedReplica("chat", params=FAST) as plain:
        with pytest.raises(RuntimeError, match="HTTP face is off"):
            _ = plain.http_url
    async with SimulatedReplica("chat", params=FAST, face=HttpFace) as rep:
        assert rep.http_url == f"http://127.0.0.1:{rep.http_port}" and rep.http_port not in (rep.port, 0)


async def test_health_is_503_while_the_model_loads():
    async with SimulatedReplica("chat", params=FAST, face=HttpFace, warmup_seconds=30) as rep:
        assert (await call(rep.http_port, "GET", "/health")).status == 503
        refused = await call(rep.http_port, "POST", "/generate", generate_body("a b", 2))
        assert refused.status == 503 and refused.json()["error"]["param"] == "model"


# -- SGLang /generate ---------------------------------------------------------------------------------------------


async def test_generate_unary_returns_the_text_and_meta_info(port):
    response = await call(port, "POST", "/generate", generate_body("hello there world", 5, rid="req-1"))
    assert response.status == 200
    answer = response.json()
    assert answer["text"] == tensors.generated_text(0, 5)
    meta = answer["meta_info"]
    assert meta["id"] == "req-1" and meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 5
    assert meta["cached_tokens"] == 0 and meta["finish_reason"] == {"type": "length", "length": 5}


async def test_generate_stream_sends_the_text_so_far_and_ends_with_done(port):
    response = await call(port, "POST", "/generate", generate_body("a b c", 6, stream=True))
    assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
    events = response.events()
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["text"] for c in chunks] == [tensors.generated_text(0, c["meta_info"]["completion_tokens"])
                                          for c in chunks]
    assert chunks[-1]["text"] == tensors.generated_text(0, 6)
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 6}
    assert last["prompt_tokens"] == 3 and last["completion_tokens"] == 6 and last["cached_tokens"] == 0


async def test_a_shared_two_block_prefix_is_cached_on_the_second_request(replica, port):
    prefix = words(2 * FAST.kv_block_tokens)  # two full blocks of 16 words
    first = (await call(port, "POST", "/generate", generate_body(prefix + " first tail", 2))).json()
    second = (await call(port, "POST", "/generate", generate_body(prefix + " second tail", 2, stream=True)))
    last = json.loads(second.events()[-2])["meta_info"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert last["cached_tokens"] == 2 * FAST.kv_block_tokens and last["prompt_tokens"] == 34
    load = replica.runner.engine.load()
    assert load.prefix_hit_blocks == 2 and load.prefix_lookup_blocks == 6


# -- OpenAI /v1/completions ---------------------------------------------------------------------------------------


async def test_completions_unary_has_text_and_usage(port):
    body = {"model": "chat", "prompt": "one two three four", "max_tokens": 4}
    answer = (await call(port, "POST", "/v1/completions", body)).json()
    assert answer["object"] == "text_completion" and answer["model"] == "chat"
    assert answer["choices"] == [{"index": 0, "text": tensors.generated_text(0, 4), "logprobs": None,
                                  "finish_reason": "length"}]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                               "prompt_tokens_details": {"cached_tokens": 0}}


async def test_completions_stream_sends_deltas_then_usage_then_done(port):
    body = {"model": "chat", "prompt": ["one two three"], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    events = (await call(port, "POST", "/v1/completions", body)).events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *deltas, usage = chunks
    assert "".join(c["choices"][0]["text"] for c in deltas) == tensors.generated_text(0, 5)
    assert [c["choices"][0]["finish_reason"] for c in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] == 3 and usage["usage"]["total_tokens"] == 8
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert len({c["id"] for c in chunks}) == 1


async def test_completions_stream_without_include_usage_has_no_usage_chunk(port):
    events = (await call(port, "POST", "/v1/completions", {"prompt": "x y", "max_tokens": 3, "stream": True})).events()
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all("usage" not in c and c["choices"] for c in chunks)


# -- load, disconnects, connections -------------------------------------------------------------------------------


async def test_get_load_reflects_a_running_request(replica, port):
    idle = (await call(port, "GET", "/get_load")).json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    reader, writer = await open_stream(port, "/generate", generate_body("a b c", 500, stream=True))
    try:
        await asyncio.wait_for(_read_chunk(reader), 5)
        (busy,) = (await call(port, "GET", "/get_load")).json()
        assert busy["num_running_reqs"] == 1 and busy["num_reqs"] == 1 and busy["num_waiting_reqs"] == 0
        assert busy["num_tokens"] == FAST.kv_block_tokens * replica.runner.engine.blocks_needed(3, 500)
    finally:
        writer.close()


@pytest.mark.parametrize("path,body", [
    ("/generate", generate_body("a b c", 500, stream=True)),
    ("/v1/completions", {"prompt": "a b c", "max_tokens": 500, "stream": True}),
])
async def test_a_client_leaving_mid_stream_frees_the_engine(replica, port, path, body):
    reader, writer = await open_stream(port, path, body)
    await asyncio.wait_for(_read_chunk(reader), 5)
    assert replica.runner.engine.load().running == 1
    writer.close()
    await until(lambda: replica.runner.engine.load().running == 0)
    load = replica.runner.engine.load()
    assert load.kv_blocks_free == load.kv_blocks_total and replica.runner.stats.cancelled == 1


async def test_a_client_leaving_a_unary_request_frees_the_engine(replica, port):
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request_bytes("POST", "/generate", generate_body("a b c", 500), None))
    await until(lambda: replica.runner.engine.load().running == 1)
    writer.close()
    await until(lambda: replica.runner.engine.load().running == 0)
    assert replica.runner.stats.cancelled == 1


async def test_keep_alive_serves_sequential_and_pipelined_requests_on_one_connection(port):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(5):
            writer.write(_request_bytes("GET", "/health", None, None, close=False))
            first = await _read_response(reader)
            assert first.status == 200 and first.headers["connection"] == "keep-alive"
            # A second request sent while the first generates: kept, then served in order.
            writer.write(_request_bytes("POST", "/generate", generate_body("a b", 20), None, close=False)
                         + _request_bytes("GET", "/get_load", None, None))
            generated, load = await _read_response(reader), await _read_response(reader)
            assert generated.json()["text"] == tensors.generated_text(0, 20)
            assert load.status == 200 and load.json()[0]["num_reqs"] == 0
            assert await reader.read() == b""  # Connection: close on the last one
    finally:
        writer.close()


# -- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,path,body,status,param", [
    ("POST", "/generate", b'{"text": "a b",', 400, "body"),
    ("POST", "/generate", b"[1, 2]", 400, "body"),
    ("POST", "/generate", b"\xff\xfe", 400, "body"),
    ("POST", "/generate", {"sampling_params": {"max_new_tokens": 2}}, 400, "text"),
    ("POST", "/generate", {"input_ids": [1, 2]}, 400, "text"),
    ("POST", "/generate", {"text": "   "}, 400, "text"),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": "2"}}, 400,
     "sampling_params.max_new_tokens"),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": True}}, 400,
     "sampling_params.max_new_tokens"),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400,
     "sampling_params.max_new_tokens"),
    ("POST", "/generate", {"text": "a", "sampling_params": [1]}, 400, "sampling_params"),
    ("POST", "/generate", {"text": "a", "stream": "yes"}, 400, "stream"),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 100000}}, 400,
     "sampling_params.max_new_tokens"),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": 7}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": "a", "n": 17}, 400, "n"),
    ("POST", "/v1/completions", {"prompt": "a", "n": 0}, 400, "n"),
    ("POST", "/v1/completions", {"prompt": "a", "echo": True}, 400, "echo"),
    ("POST", "/v1/completions", {"prompt": "a", "stream_options": {"include_usage": 1}}, 400,
     "stream_options.include_usage"),
    ("POST", "/v1/completions", {"model": "other", "prompt": "a"}, 404, "model"),
    ("GET", "/nowhere", None, 404, "path"),
    ("GET", "/generate", None, 405, "method"),
    ("POST", "/health", None, 405, "method"),
])
async def test_bad_input_gets_a_status_naming_the_field(port, method, path, body, status, param):
    response = await call(port, method, path, body)
    assert response.status == status, response.body
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"].startswith(param)


async def test_an_oversized_body_is_refused_from_its_content_length(port):
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 9000000\r\n\r\n")
        response = await _read_response(reader)
        writer.close()
    assert response.status == 413 and response.json()["error"]["param"] == "Content-Length"
    assert response.headers["connection"] == "close"


@pytest.mark.parametrize("head,status,param", [
    (b"POST /generate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "Transfer-Encoding"),
])
async def test_a_chunked_request_body_is_refused_and_closed(port, head, status, param):
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        response = await _read_response(reader)
        assert await reader.read() == b""
        writer.close()
    assert response.status == status and response.json()["error"]["param"] == param


@pytest.mark.parametrize("head", [
    b"POST /generate HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
], ids=["content-length", "request-line", "header-line", "header-over-limit"])
async def test_a_head_aiohttp_cannot_parse_gets_its_400_and_is_closed(port, head):
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        response = await _read_response(reader)
        assert await reader.read() == b""
        writer.close()
    assert response.status == 400


# -- both faces, one engine ---------------------------------------------------------------------------------------


async def test_grpc_and_http_give_the_same_text_and_share_the_prefix_cache(replica, port):
    prompt = words(40)  # 2 full blocks and a partial one
    async with triton.InferenceServerClient(replica.address) as client:
        result = await client.infer("chat", llm_inputs(prompt, 7))
    over_http = (await call(port, "POST", "/generate", generate_body(prompt, 7))).json()
    assert over_http["text"] == text_of(result) == tensors.generated_text(0, 7)
    assert params_of(result)["ferry_cached_tokens"] == 0
    assert over_http["meta_info"]["cached_tokens"] == 40  # cached by the gRPC request: one engine
    assert over_http["meta_info"]["prompt_tokens"] == params_of(result)["ferry_prompt_tokens"] == 40


async def test_cached_token_accounting_does_not_depend_on_the_face():
    prefix = words(2 * FAST.kv_block_tokens)
    prompts = [prefix + " a", prefix + " b c", words(5, "z")]
    async with (SimulatedReplica("chat", params=FAST) as by_grpc,
                SimulatedReplica("chat", params=FAST, face=HttpFace) as by_http):
        grpc_seen, http_seen = [], []
        async with triton.InferenceServerClient(by_grpc.address) as client:
            for p in prompts:
                params = params_of(await client.infer("chat", llm_inputs(p, 3)))
                grpc_seen.append((params["ferry_prompt_tokens"], params["ferry_cached_tokens"]))
        for p in prompts:
            answer = await call(by_http.http_port, "POST", "/v1/completions", {"prompt": p, "max_tokens": 3})
            usage = answer.json()["usage"]
            http_seen.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
        assert grpc_seen == http_seen == [(33, 0), (34, 32), (5, 0)]
        g, h = by_grpc.runner.engine.load(), by_http.runner.engine.load()
        assert (g.prefix_hit_blocks, g.prefix_lookup_blocks) == (h.prefix_hit_blocks, h.prefix_lookup_blocks)
        metrics = by_http.render_metrics()
        assert 'ferry_replica_prefix_hit_blocks_total{model="chat",version="v1"} 2' in metrics


# -- token ids for vllm-router ------------------------------------------------------------------------------------


async def test_render_and_tokenize_give_stable_word_ids(port):
    rendered = (await call(port, "POST", "/v1/completions/render",
                           {"model": "chat", "prompt": "a b a", "max_tokens": 3})).json()
    (entry,) = rendered
    assert entry["token_ids"] == token_ids("a b a") and entry["token_ids"][0] == entry["token_ids"][2]
    assert entry["model"] == "chat" and entry["sampling_params"] == {"max_tokens": 3}
    tokens = (await call(port, "POST", "/tokenize", {"prompt": "a b a"})).json()
    assert tokens == {"count": 3, "max_model_len": FAST.max_context_tokens, "tokens": entry["token_ids"]}
    assert (await call(port, "POST", "/tokenize", {"text": "c"})).json()["tokens"] == token_ids("c")
    assert all(0 <= i < 2**31 for i in token_ids("any words at all"))


# -- the standalone launcher --------------------------------------------------------------------------------------


async def test_start_replicas_serves_every_face_on_loopback():
    replicas = await start_replicas(2, "chat", FAST)
    try:
        assert [r.replica_id for r in replicas] == ["r0", "r1"]
        for r in replicas:
            assert (await call(r.http_port, "GET", "/health")).status == 200
        assert len({p for r in replicas for p in (r.port, r.http_port, r.metrics_port)}) == 6
    finally:
        await stop_replicas(replicas)


def test_the_launcher_writes_its_ready_file_and_stops_on_sigterm(tmp_path):
    ready = tmp_path / "ready.json"
    log = (tmp_path / "log.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.peers.replicas", "--count", "2", "--model", "chat", "--ready-file", str(ready),
         "--engine", "max_running=4", "--engine", "decode_base_seconds=0.004"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, (tmp_path / "log.txt").read_text()
            assert time.monotonic() < deadline, "no ready file in 30 s"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid and [r["id"] for r in info["replicas"]] == ["r0", "r1"]
        for r in info["replicas"]:
            assert r["grpc"].startswith("127.0.0.1:") and r["http"].startswith("http://127.0.0.1:")
            assert r["metrics"].startswith("http://127.0.0.1:") and r["metrics"].endswith("/metrics")
            port = int(r["http"].rsplit(":", 1)[1])
            assert asyncio.run(call(port, "GET", "/health")).status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_the_launcher_refuses_an_unknown_engine_key():
    from tools.peers.replicas import main

    with pytest.raises(SystemExit, match="nope"):
        main(["--engine", "nope=1"])


# -- OpenAI chat --------------------------------------------------------------------------------------------------


async def test_chat_unary_joins_the_messages_and_answers_an_assistant_message(port):
    body = {"model": "chat", "max_completion_tokens": 3,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "one two"}]}]}
    answer = (await call(port, "POST", "/v1/chat/completions", body)).json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": tensors.generated_text(0, 3)},
                                  "logprobs": None, "finish_reason": "length"}]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                               "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.timeout(10)
async def test_chat_stream_with_include_usage_nulls_usage_until_one_final_chunk(port):
    body = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    events = (await call(port, "POST", "/v1/chat/completions", body)).events()
    assert events[-1] == "[DONE]"
    *chunks, last = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None and len(c["choices"]) == 1
               for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[-1] == {}
    assert "".join(d.get("content", "") for d in deltas) == tensors.generated_text(0, 5)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5 and last["usage"]["prompt_tokens"] == 3
    assert len({c["id"] for c in [*chunks, last]}) == 1


@pytest.mark.timeout(10)
async def test_chat_stream_without_include_usage_has_no_usage_field(port):
    body = {"messages": [{"role": "user", "content": "x y"}], "max_tokens": 2, "stream": True}
    events = (await call(port, "POST", "/v1/chat/completions", body)).events()
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all("usage" not in c and c["choices"] for c in chunks)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, "model"),
], ids=["no-messages", "image-part", "zero-budget", "other-model"])
async def test_chat_refuses_bad_input_naming_the_field(port, body, param):
    response = await call(port, "POST", "/v1/chat/completions", body)
    assert response.status in (400, 404) and response.json()["error"]["param"] == param


# -- where answers end: natural length, stop strings, max_tokens (agent.replica.answer) ---------------------------

ANSWERS = dataclasses.replace(FAST, answer_tokens=12, answer_min_tokens=4)


@pytest.fixture
async def answering():
    async with SimulatedReplica("chat", "v1", params=ANSWERS, replica_id="r1", face=HttpFace) as rep:
        yield rep


async def test_an_answer_without_max_tokens_ends_at_its_natural_length_with_stop(answering):
    prompt, n = with_natural(ANSWERS, 6, 30)
    answer = (await call(answering.http_port, "POST", "/v1/completions", {"prompt": prompt})).json()
    assert answer["choices"][0]["text"] == tensors.generated_text(0, n)
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == n
    chat = {"messages": [{"role": "user", "content": prompt}], "stream": True}
    chunks = [json.loads(e) for e in (await call(answering.http_port, "POST", "/v1/chat/completions",
                                                 chat)).events()[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == tensors.generated_text(0, n)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "stop"]


async def test_max_tokens_before_the_natural_end_is_length_and_ignore_eos_runs_it_out(answering):
    prompt, n = with_natural(ANSWERS, 6, 30)
    short = (await call(answering.http_port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 5})).json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 5
    body = {"messages": [{"role": "user", "content": prompt}], "max_completion_tokens": n + 7, "ignore_eos": True}
    full = (await call(answering.http_port, "POST", "/v1/chat/completions", body)).json()
    assert full["choices"][0]["finish_reason"] == "length" and full["usage"]["completion_tokens"] == n + 7
    assert answering.runner.engine.load().kv_blocks_free == ANSWERS.kv_blocks_total


async def test_generate_names_what_matched_at_a_stop(answering):
    prompt, n = with_natural(ANSWERS, 6, 30)
    natural = (await call(answering.http_port, "POST", "/generate", generate_body(prompt, 100))).json()["meta_info"]
    assert natural["finish_reason"] == {"type": "stop", "matched": EOS_TOKEN_ID} and natural["completion_tokens"] == n
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 100, "stop": ["tokens", "river"]}}
    cut = (await call(answering.http_port, "POST", "/generate", body)).json()
    assert cut["text"] == "the ferry crosses a" and cut["meta_info"]["finish_reason"] == {"type": "stop",
                                                                                        "matched": "river"}
    body["sampling_params"] = {"max_new_tokens": 3, "stop": "river", "ignore_eos": True}
    capped = (await call(answering.http_port, "POST", "/generate", body)).json()["meta_info"]
    assert capped["finish_reason"] == {"type": "length", "length": 3}


async def test_a_stop_string_ends_the_answer_on_every_openai_route(port):
    body = {"prompt": "a b", "max_tokens": 50, "stop": "river", "stream": True,
            "stream_options": {"include_usage": True}}
    *chunks, usage = [json.loads(e) for e in (await call(port, "POST", "/v1/completions", body)).events()[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "the ferry crosses a"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and usage["usage"]["completion_tokens"] == 4
    chat = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 50, "stop": ["zzz", "the"]}
    answer = (await call(port, "POST", "/v1/chat/completions", chat)).json()  # stops before the first word
    assert answer["choices"][0]["message"]["content"] == "" and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 0


async def test_the_default_budget_is_the_context_left_after_the_prompt(answering, port):
    left = 3
    prompt = words(ANSWERS.max_context_tokens - left)  # its natural length is at least the floor, 4 > 3
    answer = (await call(answering.http_port, "POST", "/v1/completions", {"prompt": prompt})).json()
    assert answer["usage"]["completion_tokens"] == left and answer["choices"][0]["finish_reason"] == "length"
    full = await call(port, "POST", "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": words(FAST.max_context_tokens)}]})
    assert full.status == 400 and full.json()["error"]["param"] == "messages"
    over = await call(port, "POST", "/v1/completions", {"prompt": "a b", "max_tokens": FAST.max_context_tokens})
    assert over.status == 400 and over.json()["error"]["param"] == "max_tokens"
    rendered = (await call(port, "POST", "/v1/completions/render", {"prompt": "a b c"})).json()
    assert rendered[0]["sampling_params"] == {"max_tokens": FAST.max_context_tokens - 3}


async def test_both_faces_end_the_same_prompt_at_the_same_word(answering):
    prompt, n = with_natural(ANSWERS, 6, 30)
    async with triton.InferenceServerClient(answering.address) as client:
        result = await client.infer("chat", llm_inputs(prompt, 100))
    over_http = (await call(answering.http_port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 100}))
    assert text_of(result) == over_http.json()["choices"][0]["text"] == tensors.generated_text(0, n)
    assert params_of(result)["ferry_finish_reason"] == "stop" == over_http.json()["choices"][0]["finish_reason"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "a", "stop": 3}, "stop"),
    ("/v1/completions", {"prompt": "a", "stop": ["x", 3]}, "stop"),
    ("/v1/completions", {"prompt": "a", "stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {"prompt": "a", "stop": ["x" * 257]}, "stop[0]"),
    ("/v1/completions", {"prompt": "a", "ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "stop": {"s": 1}}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, "max_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"stop": [None]}}, "sampling_params.stop"),
    ("/generate", {"text": "a", "sampling_params": {"ignore_eos": 1}}, "sampling_params.ignore_eos"),
], ids=str)
async def test_bad_stop_and_ignore_eos_fields_are_refused_by_name(port, path, body, param):
    response = await call(port, "POST", path, body)
    assert response.status == 400 and response.json()["error"]["param"] == param
