"""The simulated model (agent.replica.model): tool calls, structured output and n, on both faces of a real replica.

The KServe face is driven with tritonclient and prompts rendered by the proxy's own chat template; the HTTP face
with the official ``openai`` SDK.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import numpy as np
import openai
import pydantic
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from agent.replica import logprobs, model, tensors
from agent.replica.answer import Limit, answer_limit
from agent.replica.server import SimulatedReplica
from dataplane.api import tools as hermes
from dataplane.api.chat import ChatTemplates
from tests.agent.helpers import FAST, llm_inputs, params_of, text_of
from tests.tools.test_replicaface import call
from tools.peers.replicaface import HttpFace

pytestmark = pytest.mark.timeout(30)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer",
                                                                                         "minimum": 1}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


class Weather(pydantic.BaseModel):
    city: str
    degrees: float
    sunny: bool
    hours: list[int]


class Forecast(pydantic.BaseModel):
    days: list[Weather] = pydantic.Field(min_length=2)
    note: str | None


def render(messages: list[dict[str, Any]], offered: list[dict[str, Any]] = ()) -> str:  # type: ignore[assignment]
    """The prompt the proxy's default (hermes) template renders."""
    return ChatTemplates({}, max_bytes=1 << 20).render("chat", messages, offered)


def validate(value: Any, schema: Any) -> None:
    jsonschema.Draft202012Validator(schema).validate(value)


@pytest.fixture
async def replica():
    async with SimulatedReplica("chat", "v1", params=FAST, replica_id="r1", face=HttpFace) as rep:
        yield rep


@pytest.fixture
async def grpc_client(replica):
    client = triton.InferenceServerClient(replica.address)
    yield client
    await client.close()


@pytest.fixture
async def sdk(replica):
    client = openai.AsyncOpenAI(base_url=replica.http_url + "/v1", api_key="none", max_retries=0, timeout=10)
    yield client
    await client.close()


# -- the rule, on rendered prompts -----------------------------------------------------------------------------------

def test_tools_are_offered_by_the_block_the_template_renders() -> None:
    assert model.offered_tool(render(ASK, [WEATHER, TIME])) == ("get_weather", WEATHER["function"]["parameters"])
    assert model.offered_tool(render(ASK)) is None
    assert model.offered_tool("within <tools></tools> XML tags: none here") is None
    assert model.offered_tool("<tools>\nnot json\n{\"name\": \"bare\"}\n</tools>") == ("bare", None)
    assert model.offered_tool("x\n<tools>\n[1]\n</tools>\n{\"name\": \"after\"}") is None


def test_a_conversation_ends_with_a_tool_result_only_when_nothing_but_markup_follows_it() -> None:
    called = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert not model.ends_with_tool_result(render(ASK, [WEATHER]))
    assert model.ends_with_tool_result(render([*ASK, called, result], [WEATHER]))
    assert model.ends_with_tool_result(render([*ASK, called, result, result], [WEATHER]))
    later = [*ASK, called, result, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Paris?"}]
    assert not model.ends_with_tool_result(render(later, [WEATHER]))


def test_a_script_is_whitespace_tokens_that_join_into_its_text() -> None:
    script = model.call_script("f", WEATHER["function"]["parameters"], "tools")
    assert script.text.startswith("<tool_call>\n{\"name\": \"f\"") and script.text.endswith("}\n</tool_call>")
    assert all(len(t.split()) == 1 for t in script.tokens) and len(script.tokens) == len(script.text.split())
    start, end = script.arguments
    validate(json.loads(script.text[start:end]), WEATHER["function"]["parameters"])


def test_a_call_comes_before_the_schema_and_the_schema_after_the_tool_result() -> None:
    schema = json.dumps(Weather.model_json_schema())
    called = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{}"}}]}
    first = model.kserve_script(render(ASK, [WEATHER]), (schema,))
    assert first is not None and first.call and first.name == "get_weather"
    then = model.kserve_script(render([*ASK, called, {"role": "tool", "content": "sunny"}], [WEATHER]), (schema,))
    assert then is not None and not then.call
    Weather.model_validate_json(then.text)
    assert model.kserve_script(render(ASK), None) is None


def test_a_script_ends_after_its_last_token_whatever_the_natural_length_says() -> None:
    script = model.json_script(Weather.model_json_schema(), "x").tokens
    on = dataclasses.replace(FAST, answer_tokens=3, answer_min_tokens=2)
    assert answer_limit("p", 500, params=on, script=script) == Limit(len(script), "stop", script=script)
    assert answer_limit("p", 500, params=on, ignore_eos=True, script=script).words == len(script)
    assert answer_limit("p", len(script), script=script).reason == "length"  # the end token did not fit
    cut = answer_limit("p", 500, ['"sunny"'], script=script)
    assert cut.reason == "stop" and cut.matched == '"sunny"' and '"sunny"' not in cut.text(0, cut.words)
    assert cut.text(0, cut.words + 1).endswith('"sunny":')


# -- KServe face --------------------------------------------------------------------------------------------------

def guided(schema: Any) -> InferInput:
    tensor = InferInput("guided_json", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[json.dumps(schema).encode()]], dtype=object))
    return tensor


async def kserve_stream(client: triton.InferenceServerClient, inputs: list[InferInput]) -> list[Any]:
    async def requests():
        yield {"model_name": "chat", "inputs": inputs, "request_id": "s1"}

    responses = []
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        responses.append(result)
        if params_of(result).get("triton_final_response"):
            break
    return responses


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
async def test_guided_json_answers_an_instance_of_the_schema(grpc_client, stream: bool) -> None:
    schema = Forecast.model_json_schema()
    inputs = [*llm_inputs("the forecast please", 500, stream=True if stream else None), guided(schema)]
    if stream:
        responses = await kserve_stream(grpc_client, inputs)
        assert len(responses) > 2  # in pieces, like any answer
        for r in responses:
            assert params_of(r)["ferry_completion_tokens"] == len(text_of(r).split())
        text, last = "".join(text_of(r) for r in responses), params_of(responses[-1])
        tokens = sum(params_of(r)["ferry_completion_tokens"] for r in responses)
    else:
        result = await grpc_client.infer("chat", inputs)
        text, last = text_of(result), params_of(result)
        tokens = last["ferry_completion_tokens"]
    Forecast.model_validate_json(text)
    validate(json.loads(text), schema)
    assert last["ferry_finish_reason"] == "stop" and tokens == len(text.split())


async def test_guided_json_cut_by_max_tokens_is_its_beginning_with_length(grpc_client) -> None:
    schema = Weather.model_json_schema()
    whole = text_of(await grpc_client.infer("chat", [*llm_inputs("w", 500), guided(schema)]))
    result = await grpc_client.infer("chat", [*llm_inputs("w", 3), guided(schema)])
    assert whole.startswith(text_of(result)) and len(text_of(result).split()) == 3
    assert params_of(result)["ferry_finish_reason"] == "length"


@pytest.mark.parametrize(("schema", "reason"), [
    (b"{not json", "not JSON"), (json.dumps({"type": "array", "minItems": 10**6}).encode(), "minItems")])
async def test_a_bad_guided_json_is_refused_naming_it(grpc_client, schema: bytes, reason: str) -> None:
    tensor = InferInput("guided_json", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[schema]], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        await grpc_client.infer("chat", [*llm_inputs("p", 50), tensor])
    assert "INVALID_ARGUMENT" in str(refused.value.status()) and "guided_json" in refused.value.message()
    assert reason in refused.value.message()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
async def test_a_prompt_offering_tools_gets_the_hermes_call_of_the_first(grpc_client, stream: bool) -> None:
    prompt = render(ASK, [WEATHER, TIME])
    if stream:
        responses = await kserve_stream(grpc_client, llm_inputs(prompt, 200, stream=True))
        text, last = "".join(text_of(r) for r in responses), params_of(responses[-1])
    else:
        result = await grpc_client.infer("chat", llm_inputs(prompt, 200))
        text, last = text_of(result), params_of(result)
    content, calls = hermes.parse(text)  # the proxy's own parser
    assert content is None and [c.name for c in calls] == ["get_weather"] and last["ferry_finish_reason"] == "stop"
    validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    assert text == model.call_script("get_weather", json.loads(prompt.split("\n<tools>\n")[1].split("\n")[0])[
        "function"]["parameters"], "x").text


async def test_after_a_tool_result_the_model_answers_words_and_calls_again_on_a_new_question(grpc_client) -> None:
    first = text_of(await grpc_client.infer("chat", llm_inputs(render(ASK, [WEATHER]), 200)))
    _, (made,) = hermes.parse(first)
    called = {"role": "assistant", "content": None, "tool_calls": [made.openai()]}
    result = {"role": "tool", "tool_call_id": made.id, "content": "sunny"}
    answer = await grpc_client.infer("chat", llm_inputs(render([*ASK, called, result], [WEATHER]), 6))
    assert text_of(answer) == tensors.generated_text(0, 6)
    again = [*ASK, called, result, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Bergen?"}]
    assert hermes.parse(text_of(await grpc_client.infer("chat", llm_inputs(render(again, [WEATHER]), 200))))[1]


async def test_a_tool_whose_schema_has_no_arguments_is_refused_naming_the_prompt(grpc_client) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string", "minLength": 10**6}}}
    with pytest.raises(InferenceServerException) as refused:
        await grpc_client.infer("chat", llm_inputs(render(ASK, [bad]), 50))
    assert "text_input" in refused.value.message() and "minLength" in refused.value.message()


# -- HTTP face, with the openai SDK ---------------------------------------------------------------------------------

async def test_tools_are_answered_with_tool_calls(sdk) -> None:
    answer = await sdk.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER, TIME])
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (made,) = choice.message.tool_calls or []
    assert made.id.startswith("call_") and made.type == "function" and made.function.name == "get_weather"
    validate(json.loads(made.function.arguments), WEATHER["function"]["parameters"])
    script = model.call_script("get_weather", WEATHER["function"]["parameters"], "x")
    assert answer.usage is not None and answer.usage.completion_tokens == len(script.tokens)
    named = await sdk.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {"zone": "UTC"}
    unused = await sdk.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], tool_choice="none",
                                               max_tokens=4)
    assert unused.choices[0].message.content == tensors.generated_text(0, 4)
    follow = await sdk.chat.completions.create(model="chat", tools=[WEATHER], max_tokens=5, messages=[
        *ASK, choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": made.id,
                                                             "content": "sunny"}])
    assert follow.choices[0].message.content == tensors.generated_text(0, 5)
    assert not follow.choices[0].message.tool_calls


async def test_a_streamed_tool_call_comes_in_parts_the_sdk_puts_together(sdk) -> None:
    chunks = [c async for c in await sdk.chat.completions.create(
        model="chat", messages=ASK, tools=[WEATHER], stream=True, stream_options={"include_usage": True})]
    assert chunks[0].choices[0].delta.role == "assistant"
    parts = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert parts[0].index == 0 and parts[0].id and parts[0].type == "function"
    assert parts[0].function.name == "get_weather" and len(parts) > 1 and all(p.index == 0 for p in parts)
    arguments = "".join(p.function.arguments or "" for p in parts)
    validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    script = model.call_script("get_weather", WEATHER["function"]["parameters"], "x")
    assert chunks[-1].usage.completion_tokens == len(script.tokens)
    async with sdk.chat.completions.stream(model="chat", messages=ASK, tools=[WEATHER]) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == arguments


async def test_a_call_cut_by_max_tokens_is_text_with_length(sdk) -> None:
    answer = await sdk.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], max_tokens=3)
    (choice,) = answer.choices
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content and choice.message.content.startswith("<tool_call>")


async def test_parse_with_a_pydantic_model_gives_the_parsed_object(sdk) -> None:
    answer = await sdk.chat.completions.parse(model="chat", messages=ASK, response_format=Forecast)
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and len(parsed.days) >= 2 and answer.choices[0].finish_reason == "stop"
    async with sdk.chat.completions.stream(model="chat", messages=ASK, response_format=Weather) as stream:
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Weather)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
async def test_json_object_on_chat_and_completions(sdk, stream: bool) -> None:
    if stream:
        chunks = [c async for c in await sdk.completions.create(
            model="chat", prompt="json", stream=True, stream_options={"include_usage": True},
            extra_body={"response_format": {"type": "json_object"}})]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(text.split())
    else:
        answer = await sdk.chat.completions.create(model="chat", messages=ASK, response_format={"type": "json_object"})
        text = answer.choices[0].message.content or ""
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
async def test_n_choices_count_the_prompt_once(sdk, stream: bool) -> None:
    one = await sdk.chat.completions.create(model="chat", messages=ASK, max_tokens=4)
    assert one.usage is not None
    if not stream:
        answer = await sdk.chat.completions.create(model="chat", messages=ASK, max_tokens=4, n=3)
        assert [c.index for c in answer.choices] == [0, 1, 2]
        assert all(c.message.content == tensors.generated_text(0, 4) for c in answer.choices)
        assert answer.usage is not None and answer.usage.prompt_tokens == one.usage.prompt_tokens
        assert answer.usage.completion_tokens == 12
        calls = await sdk.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], n=2)
        assert [c.finish_reason for c in calls.choices] == ["tool_calls"] * 2
        texts = await sdk.completions.create(model="chat", prompt="the river", max_tokens=2, n=2)
        assert [c.index for c in texts.choices] == [0, 1] and texts.usage.completion_tokens == 4
        return
    chunks = [c async for c in await sdk.chat.completions.create(
        model="chat", messages=ASK, max_tokens=4, n=2, stream=True, stream_options={"include_usage": True})]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.delta.content or "" for c in mine) == tensors.generated_text(0, 4)
        assert [c.finish_reason for c in mine][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"n": 17}, "n"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/completions", {"prompt": "a", "n": 99}, "n"),
    ("/v1/chat/completions", {"tools": {"a": 1}}, "tools"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools[0]"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
     "tools[0].function.parameters"),
    ("/v1/chat/completions", {"tools": [WEATHER, {"type": "function", "function": {
        "name": "g", "parameters": {"type": "array"}}}], "tool_choice": {"type": "function",
                                                                           "function": {"name": "g"}}},
     "tools[1].function.parameters"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": False}}},
     "response_format.json_schema.schema"),
    ("/v1/completions", {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"$ref": "#/nowhere"}}}}, "response_format.json_schema.schema"),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("/") else None)
async def test_bad_model_fields_are_refused_naming_them(replica, path: str, body: dict[str, Any], param: str) -> None:
    full = {"messages": ASK, **body} if path.endswith("chat/completions") else body
    response = await call(replica.http_port, "POST", path, full)
    assert response.status == 400, response.body
    assert response.json()["error"]["param"] == param


def test_the_models_log_probabilities_are_deterministic_and_ordered() -> None:
    assert logprobs.logprob(" river", 3) == logprobs.logprob(" river", 3)
    assert -4.01 <= logprobs.logprob(" river", 3) <= -0.01
    found = logprobs.alternatives(" river", 3, 3)
    assert found[0] == (" river", logprobs.logprob(" river", 3)) and len(found) == 3
    assert [v for _, v in found] == sorted((v for _, v in found), reverse=True)
    assert logprobs.alternatives(" river", 3, 0) == []


async def test_kserve_answers_log_probabilities_when_asked(grpc_client) -> None:
    asked = InferInput("return_log_probs", [1, 1], "BOOL")
    asked.set_data_from_numpy(np.array([[True]]))
    top = InferInput("top_logprobs", [1, 1], "INT32")
    top.set_data_from_numpy(np.array([[2]], dtype=np.int32))
    result = await grpc_client.infer("chat", [*llm_inputs("hello river", 4), asked, top])
    tokens = [t.decode() for t in result.as_numpy("output_tokens").reshape(-1)]
    assert "".join(tokens) == text_of(result)
    values = result.as_numpy("output_log_probs").reshape(-1)
    assert list(values) == pytest.approx([logprobs.logprob(t, i) for i, t in enumerate(tokens)], abs=1e-6)
    tops = [json.loads(t) for t in result.as_numpy("top_logprobs").reshape(-1)]
    assert all(len(t) == 2 and next(iter(t)) == tokens[i] for i, t in enumerate(tops))
    plain = await grpc_client.infer("chat", llm_inputs("hello river", 4))
    assert plain.as_numpy("output_log_probs") is None  # not asked: not sent


async def test_the_openai_face_answers_log_probabilities_in_openais_shape(sdk) -> None:
    answer = await sdk.chat.completions.create(model="chat", messages=ASK, max_tokens=4, logprobs=True,
                                               top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert "".join(t.token for t in content) == answer.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 for t in content)
    chunks = [c async for c in await sdk.completions.create(model="chat", prompt="the river", max_tokens=4,
                                                            logprobs=1, stream=True)]
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert "".join(tokens) == "".join(c.choices[0].text for c in chunks if c.choices)
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(model="chat", messages=ASK, top_logprobs=2)
