"""The HTTP front door as OpenAI's clients use it: defaults, n and prompt lists, echo, token ids, the typed schema.

In process: the rig's fake control plane and replicas, aiohttp's client over loopback (tests.dataplane.test_http).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dataplane.api import openai, schema
from dataplane.api import tools as tooling
from ferry.config import ModelConfig
from ferry.errors import InvalidArgument
from ferry.tokens import Tokenizers
from ferry.v1 import inference_pb2
from tests.dataplane.conftest import PAID
from tests.dataplane.fakes import Behaviour, parse
from tests.dataplane.test_http import AUTH, front, post
from tests.test_tokens_hf import make_tokenizer

pytestmark = pytest.mark.timeout(20)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi there"}]}


async def events(base: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(base + path, headers=AUTH, json=body) as resp:
        assert resp.status == 200, await resp.text()
        lines = [line.decode().strip() async for line in resp.content if line.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


async def test_without_max_tokens_the_answer_may_fill_the_context(rig) -> None:
    # OpenAI's default: no cap but the context (the fake replicas take 4,096 tokens), not 16
    r, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/chat/completions", CHAT)
    assert status == 200, body
    prompt, max_tokens, _ = parse(r.replicas["r1"].requests[0])
    assert max_tokens == 4096 - len(prompt.split())
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "a b c"})
    assert status == 200 and parse(r.replicas["r1"].requests[1])[1] == 4096 - 3
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "w " * 4096})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "prompt"


async def test_n_fans_out_as_n_requests_to_one_replica(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour(), "r2": Behaviour()})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "n": 3, "max_tokens": 4})
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] for c in body["choices"])
    served = r.served()
    assert sorted(served.values()) == [0, 3]  # the same prefix: one replica's cache
    each = body["choices"]
    assert body["usage"]["completion_tokens"] == 3 * (body["usage"]["completion_tokens"] // 3) and len(each) == 3
    requests = [req for replica in r.replicas.values() for req in replica.requests]
    assert len({req.id for req in requests}) == 3  # each choice its own request id


async def test_a_list_of_prompts_answers_each_in_order_and_echo_repeats_them(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": ["one", "two two"], "n": 2,
                                                           "max_tokens": 2, "echo": True})
    assert status == 200, body
    texts = [c["text"] for c in body["choices"]]
    assert len(texts) == 4 and [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert texts[0].startswith("one") and texts[1].startswith("one") and texts[2].startswith("two two")
    assert body["usage"]["prompt_tokens"] == 1 + 2  # each prompt counted once, whatever n


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_n_streams_every_choice_tagged_with_its_index(rig, path: str) -> None:
    _, base = await front(rig, {"r1": Behaviour(chunks=3)})
    body: dict[str, Any] = {"model": "m", "n": 2, "max_tokens": 3, "stream": True,
                            "stream_options": {"include_usage": True}}
    body |= CHAT if "chat" in path else {"prompt": "p", "echo": True}
    chunks = await events(base, path, body)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    by_index: dict[int, list[dict[str, Any]]] = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        by_index.setdefault(choice["index"], []).append(choice)
    assert sorted(by_index) == [0, 1]
    for choices in by_index.values():
        assert choices[-1]["finish_reason"] in ("stop", "length")
        assert all(c["finish_reason"] is None for c in choices[:-1])
        if "chat" in path:
            assert choices[0]["delta"]["role"] == "assistant"
        else:
            assert choices[0]["text"] == "p"  # echo: the prompt first


async def test_token_id_prompts_are_read_by_the_models_tokenizer(rig, tmp_path: Path) -> None:
    tokenizers = Tokenizers.load([("m", str(make_tokenizer(tmp_path / "tokenizer.json")))])
    r, base = await front(rig, {"r1": Behaviour()}, tokenizers=tokenizers)
    ids = tokenizers.get("m").ids("hello, world!")
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 2})
    assert status == 200, body
    assert parse(r.replicas["r1"].requests[0])[0] == tokenizers.get("m").decode(ids)
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": [ids, ids], "max_tokens": 2})
    assert status == 200 and len(body["choices"]) == 2


async def test_token_ids_without_a_tokenizer_file_are_refused_naming_the_model(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": [1, 2, 3]})
    assert status == 400 and body["error"]["param"] == "prompt" and "'m'" in body["error"]["message"]
    assert body["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize(("extra", "param"), [
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),  # its replicas declare no guided_json
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
])
async def test_a_field_openai_defines_that_the_model_cannot_serve_is_400_naming_it(rig, extra: dict[str, Any],
                                                                                   param: str) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, **extra})
    assert status == 400, body
    error = body["error"]
    assert error["param"] == param and error["code"] == "unsupported_parameter" and "'m'" in error["message"]
    assert "unknown" not in error["message"]


@pytest.mark.parametrize("extra", [{"logprobs": False}, {"tool_choice": "none"}, {"response_format": {"type": "text"}},
                                   {"parallel_tool_calls": True, "store": False, "metadata": {"a": "b"}}])
async def test_fields_openai_defines_at_their_off_values_are_served(rig, extra: dict[str, Any]) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "max_tokens": 2, **extra})
    assert status == 200, body


async def test_fields_openai_does_not_define_are_counted_or_refused_when_strict(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()})
    status, _, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1,
                                                        "my_field": 1})
    assert status == 200
    counted = r.proxy.metrics.registry.get_sample_value("ferry_proxy_ignored_fields_total", {"field": "my_field"})
    assert counted == 1.0
    _, base = await front(rig, {"r1": Behaviour()}, settings={"http_strict_fields": True})
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "x", "my_field": 1})
    assert status == 400 and body["error"]["param"] == "my_field" and body["error"]["code"] == "unknown_parameter"


async def test_the_openapi_document_is_served_without_a_key(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    async with aiohttp.ClientSession() as s, s.get(base + "/openapi.json") as resp:
        document = await resp.json()
    assert resp.status == 200 and document["openapi"].startswith("3.1")
    assert set(document["paths"]) >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{model}"}
    request = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert request["schema"]["$ref"].endswith("/ChatRequest")
    assert "tools" in document["components"]["schemas"]["ChatRequest"]["properties"]


@pytest.mark.parametrize(("body", "field", "code"), [
    ({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 3}]},
     "messages[1].content", "invalid_type"),
    ({"model": "m", "messages": [{"role": "robot", "content": "a"}]}, "messages[0].role", "invalid_value"),
    ({"model": "m", "messages": []}, "messages", "invalid_value"),
    ({"model": "m", "messages": [{"role": "user", "content": "a"}], "n": 17}, "n", "invalid_value"),
    ({"model": "m", "messages": [{"role": "user", "content": "a"}], "temperature": True}, "temperature",
     "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": "a"}], "stop": ["a", "b", "c", "d", "e"]}, "stop",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": "a"}]}, "model", "invalid_value"),
])
def test_the_schema_names_the_field_and_openais_code(body: dict[str, Any], field: str, code: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        openai.parse_chat(json.dumps(body).encode())
    assert refused.value.field == field and refused.value.code == code, refused.value


def test_a_body_that_is_not_an_object_or_not_json_names_body() -> None:
    for raw in (b"[1]", b"{not json", b"\xff\xfe", b"1"):
        with pytest.raises(InvalidArgument) as refused:
            openai.parse_completion(raw)
        assert refused.value.field == "body"


def test_the_document_declares_every_field_the_parser_reads() -> None:
    properties = schema.openapi()["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "n", "echo", "logprobs", "stream_options", "max_tokens", "seed", "stop"} <= set(properties)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


async def test_tools_are_offered_in_the_prompt_and_the_models_call_parsed_out(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour(script=("Let me look. ", CALL))})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "tools": [WEATHER]})
    assert status == 200, body
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look. "
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    prompt = parse(r.replicas["r1"].requests[0])[0]
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


async def test_a_streamed_call_split_across_pieces_is_one_tool_call_delta(rig) -> None:
    script = ("Hi <tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}\n</tool_', "call> bye")
    _, base = await front(rig, {"r1": Behaviour(script=script)})
    chunks = await events(base, "/v1/chat/completions", {**CHAT, "tools": [WEATHER], "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert text == "Hi  bye" and len(calls) == 1
    assert calls[0]["index"] == 0 and calls[0]["function"] == {"name": "get_weather",
                                                               "arguments": '{"city": "Oslo"}'}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_the_conversation_goes_on_with_the_tools_result(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour(script=("It is sunny in Oslo.",))})
    messages = [{"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    status, body, _ = await post(base, "/v1/chat/completions", {"model": "m", "messages": messages,
                                                                "tools": [WEATHER]})
    assert status == 200 and body["choices"][0]["finish_reason"] != "tool_calls"
    prompt = parse(r.replicas["r1"].requests[0])[0]
    assert CALL in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt


async def test_tool_choice_none_offers_nothing_and_parses_nothing(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour(script=(CALL,))})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "tools": [WEATHER], "tool_choice": "none"})
    assert status == 200 and body["choices"][0]["message"]["content"] == CALL
    assert "<tools>" not in parse(r.replicas["r1"].requests[0])[0]


@pytest.mark.parametrize(("extra", "models", "param"), [
    ({"tools": [WEATHER]}, [ModelConfig(name="m", tool_parser="none")], "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, [], "tool_choice"),
])
async def test_tools_a_model_cannot_take_are_refused_naming_the_field(rig, extra: dict[str, Any],
                                                                      models: list[ModelConfig], param: str) -> None:
    _, base = await front(rig, {"r1": Behaviour()}, models=models)
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, **extra})
    assert status == 400 and body["error"]["param"] == param, body


@pytest.mark.parametrize(("response_format", "schema_sent"), [
    ({"type": "json_object"}, {"type": "object"}),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}},
     {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
])
async def test_structured_output_goes_to_a_model_that_declares_guided_json(rig, response_format: dict[str, Any],
                                                                            schema_sent: dict[str, Any]) -> None:
    r, base = await front(rig, {"r1": Behaviour(script=('{"city": "Oslo"}',))},
                          loads={"r1": {"inputs": ["guided_json"]}})
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "response_format": response_format})
    assert status == 200, body
    assert json.loads(body["choices"][0]["message"]["content"]) == {"city": "Oslo"}
    sent = r.replicas["r1"].requests[0]
    (index,) = [i for i, t in enumerate(sent.inputs) if t.name == "guided_json"]
    raw = sent.raw_input_contents[index]
    assert json.loads(raw[4:].decode()) == schema_sent  # one BYTES element: length, then the schema


def test_streamed_calls_are_found_whatever_the_cut() -> None:
    text = f"a {CALL} b <tool_call>not json</tool_call> c"
    for size in (1, 2, 3, 7, len(text)):
        stream = tooling.Stream()
        released, calls = [], []
        for start in range(0, len(text), size):
            out, found = stream.feed(text[start:start + size])
            released.append(out)
            calls += found
        released.append(stream.end())
        assert "".join(released) == "a  b <tool_call>not json</tool_call> c", size
        assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert tooling.parse(text)[0] == "a  b <tool_call>not json</tool_call> c"
    assert tooling.parse("<tool_call>{") == ("<tool_call>{", [])


LOGPROB_INPUTS = {"r1": {"inputs": ["return_log_probs", "top_logprobs"]}}


async def test_chat_logprobs_with_alternatives_unary_and_streamed(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour(logprobs=True, chunks=3)}, loads=LOGPROB_INPUTS)
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, "max_tokens": 3, "logprobs": True,
                                                                "top_logprobs": 2})
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    words = body["choices"][0]["message"]["content"].split()
    assert [e["token"].strip() for e in content] == words
    assert content[0]["logprob"] == -0.5 and content[0]["bytes"] == list(content[0]["token"].encode())
    assert [t["token"] for t in content[0]["top_logprobs"]] == [content[0]["token"], "x"]
    sent = r.replicas["r1"].requests[0]
    assert {t.name: t.datatype for t in sent.inputs}.items() >= {("return_log_probs", "BOOL"),
                                                                ("top_logprobs", "INT32")}
    chunks = await events(base, "/v1/chat/completions", {**CHAT, "max_tokens": 3, "logprobs": True, "stream": True})
    with_text = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert with_text and all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in with_text)


async def test_completion_logprobs_name_tokens_offsets_and_alternatives(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour(logprobs=True)}, loads=LOGPROB_INPUTS)
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "a b", "max_tokens": 3,
                                                           "logprobs": 2})
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]).split() == body["choices"][0]["text"].split()
    assert logprobs["token_logprobs"] == [-0.5, -1.0, -1.5] and logprobs["text_offset"][0] == 0
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


async def test_logprobs_over_grpc_come_with_each_chunk(rig) -> None:
    r = await rig({"r1": Behaviour(logprobs=True, chunks=2)}, loads=LOGPROB_INPUTS)
    chunks = [c async for c in r.stub.InferStream(request_of(logprobs=True, top_logprobs=1), metadata=PAID)]
    pieces = [c for c in chunks if not c.final]
    assert pieces and all(c.logprobs and len(c.logprobs[0].top) == 1 for c in pieces)  # the one asked
    reply = await r.stub.Infer(request_of(logprobs=True), metadata=PAID)
    assert len(reply.logprobs) == len(reply.text.split()) and not reply.logprobs[0].top  # no alternative asked


@pytest.mark.parametrize(("extra", "param"), [({"top_logprobs": 2}, "top_logprobs"),
                                               ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")])
async def test_bad_logprobs_requests_name_the_field(rig, extra: dict[str, Any], param: str) -> None:
    _, base = await front(rig, {"r1": Behaviour(logprobs=True)}, loads=LOGPROB_INPUTS)
    status, body, _ = await post(base, "/v1/chat/completions", {**CHAT, **extra})
    assert status == 400 and body["error"]["param"] == param, body


def request_of(**fields: Any) -> Any:
    return inference_pb2.InferRequest(model="m", prompt="hello there", max_tokens=3, **fields)
