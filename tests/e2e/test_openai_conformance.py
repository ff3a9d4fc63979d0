"""OpenAI conformance with the official ``openai`` SDK and LangChain's ``ChatOpenAI`` against ``ferry up``.

Three fleets, each a ``ferry up`` for the module:

- ``sim-relay`` and ``sim-envoy``: 2 simulated ``chat`` replicas that end their answers naturally (``ferry
  up``'s default), through the proxy's HTTP front door (the proxy reads every token) and through Envoy with
  the endpoint pickers (the replica answers the client itself);
- ``triton-relay`` (marker ``triton``): the real Triton test server's ``llm`` model behind the proxy's front
  door. That model answers ``max_tokens`` words (no natural end), takes no tools (``tool_parser = "none"``)
  and declares no ``guided_json``: there the tests check the named 400 instead of the feature.

What a client written against OpenAI's API reads: defaults, ``stream_options.include_usage`` chunk by chunk,
``n``, ``/v1/models/{id}``, tool calls parsed by the SDK, ``response_format`` and
``chat.completions.parse`` with a pydantic model, the error codes and rate-limit headers, and LangChain's
invoke, stream and tool call, ``logprobs`` with alternatives.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child
from tools.process_fleet import FAST_REPLICA
from tools.triton.launch import TritonEnvironmentMissing, TritonProcess, start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HI = [{"role": "user", "content": "Say hello to the river."}]
# what the simulated model serves; context: its replicas report one (a prompt can be too long)
SIM_FEATURES = frozenset({"natural_end", "tools", "structured", "context", "logprobs"})


class Up:
    """A ``ferry up`` with two tenants, ``ent`` (enterprise) and ``slow`` (one request per second), and its
    door (``relay`` or ``envoy``), model and what that model serves (:data:`SIM_FEATURES`, or none)."""

    def __init__(self, workdir: Path, *, model: str, features: frozenset[str], extra: list[str],
                 models: list[dict[str, Any]], replica: dict[str, Any] | None = None) -> None:
        self.model, self.features, self.door = model, features, "relay"
        self.keys = {"ent": "fk_" + secrets.token_hex(8), "slow": "fk_" + secrets.token_hex(8)}
        config: dict[str, Any] = {
            "tenants": [{"name": "ent", "api_key_sha256": hash_api_key(self.keys["ent"]), "plan": "enterprise"},
                        {"name": "slow", "api_key_sha256": hash_api_key(self.keys["slow"]), "plan": "paid",
                         "requests_per_second": 1.0}],
            "models": models, **({"replica": replica} if replica else {})}
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "user.toml").write_text(dumps(config))
        self.child = Child("up", ["up", *extra, "--config", str(workdir / "user.toml"),
                                  "--workdir", str(workdir / "fleet")], workdir).start()
        self.ready: dict[str, Any] = self.child.wait_ready(90)

    def base(self) -> str:
        return f"http://{self.ready['http' if self.door == 'relay' else 'envoy']}/v1"

    def client(self, tenant: str = "ent", key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base(), api_key=key or self.keys[tenant], max_retries=0, timeout=60)

    def serves(self, feature: str) -> bool:
        return feature in self.features


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    run = Up(tmp_path_factory.mktemp("conformance"), model="chat", features=SIM_FEATURES,
             extra=["--replicas", "2", "--models", "chat"], models=[{"name": "chat", "min_gpus": 1}],
             replica=dict(FAST_REPLICA))
    try:
        yield run
    finally:
        run.child.stop()


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    try:
        server: TritonProcess = start_triton(tmp_path_factory.mktemp("triton"))
    except TritonEnvironmentMissing as exc:  # as tests/triton/conftest.py: CI must install it, not skip
        if os.environ.get("CI") or os.environ.get("FERRY_REQUIRE_TRITON"):
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        run = Up(tmp_path_factory.mktemp("conformance-triton"), model="llm", features=frozenset(),
                 extra=["--triton", f"{server.grpc},{server.metrics_url}", "--pickers", "0"],
                 models=[{"name": name, "default_version": "1", "tool_parser": "none"}
                         for name in ("llm", "llm-unary")])
        try:
            yield run
        finally:
            run.child.stop()
    finally:
        server.stop()


@pytest.fixture(params=["sim-relay", "sim-envoy", pytest.param("triton-relay", marks=pytest.mark.triton)])
def up(request: pytest.FixtureRequest) -> Up:
    fleet, door = str(request.param).split("-")
    run: Up = request.getfixturevalue(fleet)
    run.door = door
    return run


def test_a_chat_without_max_tokens_runs_to_the_end_of_its_answer(up: Up) -> None:
    if not up.serves("natural_end"):
        pytest.skip(f"model {up.model} answers max_tokens words: it has no end of its own")
    answer = up.client().chat.completions.create(model=up.model, messages=HI)
    (choice,) = answer.choices
    assert choice.finish_reason == "stop" and choice.message.content  # ended by the model, not at 16 tokens
    assert answer.usage is not None and 16 < answer.usage.completion_tokens < 1024


@pytest.mark.parametrize("include", [None, False, True])
def test_usage_in_a_stream_only_when_asked_in_one_last_chunk(up: Up, include: bool | None) -> None:
    extra: dict[str, Any] = {} if include is None else {"stream_options": {"include_usage": include}}
    chunks = list(up.client().chat.completions.create(model=up.model, messages=HI, max_tokens=8, stream=True,
                                                          **extra))
    content = chunks[:-1] if include else chunks
    assert all(c.usage is None and len(c.choices) == 1 for c in content)
    assert content[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    if include:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == len("".join(c.choices[0].delta.content or ""
                                                                 for c in content).split())


def test_unary_usage_is_always_there(up: Up) -> None:
    answer = up.client().completions.create(model=up.model, prompt="the river", max_tokens=5)
    assert answer.usage is not None and answer.usage.total_tokens == (answer.usage.prompt_tokens
                                                                      + answer.usage.completion_tokens)


def test_n_three_choices(up: Up) -> None:
    answer = up.client().chat.completions.create(model=up.model, messages=HI, max_tokens=6, n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content for c in answer.choices)


def test_logprobs_with_two_alternatives(up: Up) -> None:
    if not up.serves("logprobs"):
        refused(up, "logprobs", logprobs=True, top_logprobs=2)
        return
    answer = up.client().chat.completions.create(model=up.model, messages=HI, max_tokens=5, logprobs=True,
                                                 top_logprobs=2)
    (choice,) = answer.choices
    assert choice.logprobs is not None and choice.logprobs.content
    assert all(len(token.top_logprobs) == 2 and token.logprob <= 0 for token in choice.logprobs.content)
    assert "".join(t.token for t in choice.logprobs.content).split() == (choice.message.content or "").split()
    chunks = list(up.client().completions.create(model=up.model, prompt="the river", max_tokens=4, logprobs=1,
                                                  stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    assert "".join(tokens).split() == "".join(c.choices[0].text for c in chunks if c.choices).split()


def test_a_model_is_retrieved_by_id(up: Up) -> None:
    assert up.client().models.retrieve(up.model).id == up.model
    with pytest.raises(openai.NotFoundError) as missing:
        up.client().models.retrieve("nope")
    assert missing.value.code == "model_not_found"


def refused(up: Up, field: str, **request: Any) -> None:
    """The model cannot serve ``field``: a 400 naming it and the model."""
    with pytest.raises(openai.BadRequestError) as error:
        up.client().chat.completions.create(model=up.model, messages=HI, **request)
    assert error.value.param == field and error.value.code == "unsupported_parameter"
    assert f"'{up.model}'" in error.value.message


def test_a_tool_call_parsed_by_the_sdk(up: Up) -> None:
    if not up.serves("tools"):
        refused(up, "tools", tools=[WEATHER])
        return
    answer = up.client().chat.completions.create(
        model=up.model, tools=[WEATHER], messages=[{"role": "user", "content": "Weather in Oslo?"}])
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    follow = up.client().chat.completions.create(model=up.model, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"}, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert follow.choices[0].finish_reason != "tool_calls" and follow.choices[0].message.content


def test_a_streamed_tool_call(up: Up) -> None:
    if not up.serves("tools"):
        refused(up, "tools", tools=[WEATHER], stream=True)
        return
    chunks = list(up.client().chat.completions.create(
        model=up.model, tools=[WEATHER], stream=True, messages=[{"role": "user", "content": "Weather in Oslo?"}]))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_json_object_answers_json(up: Up) -> None:
    if not up.serves("structured"):
        refused(up, "response_format", response_format={"type": "json_object"})
        return
    answer = up.client().chat.completions.create(model=up.model, messages=HI,
                                                     response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


class Weather(pydantic.BaseModel):
    city: str
    degrees: float
    sunny: bool
    hours: list[int]


def test_parse_with_a_pydantic_model(up: Up) -> None:
    if not up.serves("structured"):
        with pytest.raises(openai.BadRequestError) as error:
            up.client().chat.completions.parse(model=up.model, messages=HI, response_format=Weather)
        assert error.value.param == "response_format" and error.value.code == "unsupported_parameter"
        return
    answer = up.client().chat.completions.parse(model=up.model, messages=HI, response_format=Weather)
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Weather)


def test_error_codes_are_openais(up: Up) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        up.client(key="fk_wrong").chat.completions.create(model=up.model, messages=HI)
    assert denied.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as missing:
        up.client().chat.completions.create(model="nope", messages=HI)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.BadRequestError) as typed:
        up.client().chat.completions.create(model=up.model, messages=HI, temperature="hot")  # type: ignore[arg-type]
    assert typed.value.code == "invalid_type" and typed.value.param == "temperature"
    if up.serves("context"):
        with pytest.raises(openai.BadRequestError) as long:
            up.client().completions.create(model=up.model, prompt="w " * 200_000, max_tokens=1)
        assert long.value.code == "context_length_exceeded" and long.value.param == "prompt"
    slow = up.client("slow")
    codes = []
    for _ in range(3):
        try:
            raw = slow.chat.completions.with_raw_response.create(model=up.model, messages=HI, max_tokens=1)
            assert raw.headers["x-ratelimit-limit-requests"] == "1"
        except openai.RateLimitError as limited:
            codes.append(limited.code)
            assert limited.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert codes and set(codes) == {"rate_limit_exceeded"}


def test_langchain_invoke_stream_and_a_tool_call(up: Up) -> None:
    llm = ChatOpenAI(model=up.model, base_url=up.base(), api_key=up.keys["ent"], max_retries=0, timeout=30)
    reply = (llm.bind(max_tokens=8) if not up.serves("natural_end") else llm).invoke("Say hello to the river.")
    assert reply.content
    assert reply.response_metadata["finish_reason"] == ("stop" if up.serves("natural_end") else "length")
    pieces = list(llm.bind(max_tokens=8).stream("Say hello to the river."))
    assert "".join(str(p.content) for p in pieces) and len(pieces) > 2

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    if not up.serves("tools"):
        with pytest.raises(openai.BadRequestError):
            llm.bind_tools([get_weather]).invoke("Weather in Oslo?")
        return
    called = llm.bind_tools([get_weather]).invoke("Weather in Oslo?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    assert "city" in called.tool_calls[0]["args"]
