"""The HTTP front door in process: the fake control plane and replicas of the rig, aiohttp's client over loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import aiohttp
import pytest

from dataplane.api import openai
from dataplane.api.chat import DEFAULT_TEMPLATE, ChatTemplates, load_template
from ferry.errors import ConfigError, InvalidArgument
from tests.dataplane.conftest import KEYS, TENANTS
from tests.dataplane.fakes import Behaviour, parse, route
from tests.dataplane.test_coldstart import push_and_apply, warming_snapshot

pytestmark = pytest.mark.timeout(20)

AUTH = {"Authorization": f"Bearer {KEYS['paid']}"}


async def front(rig: Any, behaviours: dict[str, Behaviour], **kw: Any) -> tuple[Any, str]:
    r = await rig(behaviours, **kw)
    port = await r.proxy.start_http("127.0.0.1:0")
    return r, f"http://127.0.0.1:{port}"


async def post(base: str, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s, s.post(base + path, data=data,
                                                    headers={**AUTH, **(headers or {})}) as resp:
        raw = await resp.read()
        try:
            return resp.status, json.loads(raw), resp.headers
        except ValueError:
            return resp.status, raw, resp.headers


async def test_completion_unary_has_usage_finish_reason_and_request_id(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()})
    status, body, headers = await post(base, "/v1/completions", {"model": "m", "prompt": "hello there world",
                                                                 "max_tokens": 3})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "r1w0 r1w1 r1w2"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 3
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    sent = r.replicas["r1"].requests[0]
    assert headers["x-request-id"] == sent.id and body["id"] == f"cmpl-{sent.id}"
    assert sent.parameters["ferry_tier"].string_param == "standard"  # the tenant's default tier
    m = r.proxy.metrics
    assert m.value("proxy_requests_total", model="m", tier="standard", status="OK") == 1


async def test_chat_renders_the_default_template_and_takes_the_tier_header(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()})
    status, body, _ = await post(base, "/v1/chat/completions",
                                 {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                                 {"x-ferry-tier": "interactive", "x-request-id": "trace-1"})
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    sent = r.replicas["r1"].requests[0]
    assert sent.id == "trace-1" and sent.parameters["ferry_tier"].string_param == "interactive"
    assert parse(sent)[0] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}, {"include_usage": True}])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_is_server_sent_events_with_usage_only_when_asked(rig, path: str,
                                                                       options: dict[str, Any] | None) -> None:
    # as OpenAI: usage only with stream_options.include_usage, in one more chunk whose choices are empty
    _, base = await front(rig, {"r1": Behaviour(chunks=3)})
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "stream": True}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    if options is not None:
        body["stream_options"] = options
    async with aiohttp.ClientSession() as s, s.post(base + path, headers=AUTH, json=body) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode().strip() async for line in resp.content if line.strip()]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    asked = bool(options and options.get("include_usage"))
    content = chunks[:-1] if asked else chunks
    assert all(len(c["choices"]) == 1 and "usage" not in c for c in content)
    key = "delta" if "chat" in path else "text"
    if "chat" in path:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in content)
    else:
        text = "".join(c["choices"][0][key] for c in content)
    assert text and content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    if asked:
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
        assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
        assert last["id"] == chunks[0]["id"] and last["object"] == chunks[0]["object"]


@pytest.mark.parametrize(("body", "headers", "status", "param"), [
    ({"model": "m", "prompt": "x"}, {"Authorization": "Bearer nope"}, 401, None),
    ({"model": "nope", "prompt": "x"}, {}, 404, "model"),
    ({"model": "m", "prompt": "x", "temperature": "hot"}, {}, 400, "temperature"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, {}, 400, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": 10**6}, {}, 400, "max_tokens"),
    ({"model": "m", "prompt": "x", "logit_bias": {"50256": -100}}, {}, 400, "logit_bias"),
    ({"model": "m"}, {}, 400, "prompt"),
    (b"{not json", {}, 400, "body"),
    (b"\xff\xfe", {}, 400, "body"),
    ({"model": "m", "prompt": "x"}, {"x-ferry-tier": "gold"}, 400, "x-ferry-tier"),
    ({"model": "m", "prompt": "x"}, {"x-ferry-timeout": "-1"}, 400, "x-ferry-timeout"),
])
async def test_refusals_in_openai_shape(rig, body: Any, headers: dict[str, str], status: int,
                                        param: str | None) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    got, answer, out = await post(base, "/v1/completions", body, headers)
    assert got == status, answer
    assert answer["error"]["param"] == param and answer["error"]["message"]
    assert out["x-request-id"]


async def test_body_over_the_bound_is_413_naming_body(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()}, settings={"http_max_body_bytes": 1024})
    status, answer, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "x" * 4096})
    assert status == 413 and answer["error"]["param"] == "body"


async def test_overload_is_429_with_retry_after(rig) -> None:
    r, base = await front(rig, {"h1": Behaviour(kind="hang")}, settings={"max_inflight": 1})
    first = asyncio.create_task(post(base, "/v1/completions", {"model": "m", "prompt": "x"}))
    await r.replicas["h1"].received.wait()
    status, answer, headers = await post(base, "/v1/completions", {"model": "m", "prompt": "x"})
    assert status == 429 and int(headers["Retry-After"]) >= 1 and answer["error"]["type"] == "rate_limit_error"
    first.cancel()
    await asyncio.wait_for(r.replicas["h1"].cancelled.wait(), 5)


async def test_disconnect_cancels_the_replica_call(rig) -> None:
    r, base = await front(rig, {"h1": Behaviour(kind="hang")})
    session = aiohttp.ClientSession()
    call = asyncio.create_task(session.post(base + "/v1/completions", headers=AUTH,
                                            json={"model": "m", "prompt": "x", "stream": True}))
    await r.replicas["h1"].received.wait()
    call.cancel()
    await session.close()
    await asyncio.wait_for(r.replicas["h1"].cancelled.wait(), 5)


async def test_models_lists_the_table_models_for_a_tenant(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/v1/models", headers=AUTH) as resp:
            body = await resp.json()
        async with s.get(base + "/v1/models") as anonymous:
            assert anonymous.status == 401
    assert [m["id"] for m in body["data"]] == ["empty", "m"]


def test_translation_names_the_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        openai.parse_chat(json.dumps({"model": "m", "messages": [{"role": "user", "content": 3}]}).encode())
    assert err.value.field == "messages[0].content"
    with pytest.raises(InvalidArgument) as err:
        openai.parse_completion(json.dumps({"model": "m", "prompt": "x", "stop": ["a"] * 5}).encode())
    assert err.value.field == "stop"
    parsed = openai.parse_completion(json.dumps({"model": "m", "prompt": "x", "temperature": 0.5, "seed": 7,
                                                 "stop": "END", "top_k": 4}).encode())
    request = openai.to_request(parsed, parsed.prompt, tier="batch", idempotency_key="k")
    assert (request.temperature, request.seed, list(request.stop), request.top_k) == (0.5, 7, ["END"], 4)
    assert not request.HasField("top_p")


def test_chat_templates_sandboxed_and_bounded(tmp_path) -> None:
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                                                   "{{ m.content }}{% endfor %}", "bos_token": "<s>"}))
    templates = ChatTemplates({"a": load_template(str(config), "models.a.chat_template"),
                               "evil": ("{{ messages.__class__.__mro__ }}", "", ""),
                               "loop": ("{% for i in range(100000) %}xxxxxxxx{% endfor %}", "", ""),
                               "refuse": ("{{ raise_exception('no system role') }}", "", "")}, max_bytes=1000)
    assert templates.render("a", [{"role": "user", "content": "hi"}]) == "<s>[user]hi"
    assert load_template("", "x")[0] == DEFAULT_TEMPLATE
    for model in ("evil", "loop", "refuse"):
        with pytest.raises(InvalidArgument) as err:
            templates.render(model, [{"role": "user", "content": "hi"}])
        assert err.value.field == "messages"
    with pytest.raises(ConfigError):
        load_template(str(tmp_path / "missing.json"), "models.b.chat_template")


async def test_idempotency_key_joins_a_repeat(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()})
    body = {"model": "m", "prompt": "once only", "max_tokens": 2}
    first = await post(base, "/v1/completions", body, {"Idempotency-Key": "k-1"})
    again = await post(base, "/v1/completions", body, {"Idempotency-Key": "k-1"})
    assert first[0] == again[0] == 200 and first[1]["choices"] == again[1]["choices"]
    assert len(r.replicas["r1"].requests) == 1
    other = await post(base, "/v1/completions", {**body, "prompt": "another"}, {"Idempotency-Key": "k-1"})
    assert other[0] == 400 and other[1]["error"]["param"] == "idempotency_key"



class _Stalled:
    """A response whose socket never drains (a reader that stopped reading)."""

    async def write(self, data: bytes) -> None:
        await asyncio.Event().wait()


async def test_a_write_to_a_reader_that_stopped_reading_times_out(rig) -> None:
    # Over loopback the kernel buffers megabytes, more than a test stream fills; the bound is the write's timeout.
    r, _ = await front(rig, {"r1": Behaviour()}, settings={"http_write_timeout_seconds": 0.05})
    with pytest.raises(TimeoutError):
        await r.proxy.http._write(_Stalled(), b"data: {}\n\n")


async def test_connections_beyond_the_bound_are_refused_and_closed(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()}, settings={"http_max_connections": 1})
    async with aiohttp.ClientSession() as first, aiohttp.ClientSession() as second:
        async with first.get(base + "/v1/models", headers=AUTH) as kept:  # keep-alive: its connection stays open
            assert kept.status == 200
        async with second.get(base + "/v1/models", headers=AUTH) as refused:
            assert refused.status == 503 and refused.headers["Retry-After"] == "1"
            assert (await refused.json())["error"]["code"] == "too_many_connections"


async def test_cold_start_is_503_with_retry_after(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()}, settings={"coldstart_warmup_seconds": 20.0})
    await push_and_apply(r, warming_snapshot(2, [route(r.replicas["r1"])], warming={"v2": 1}, default_version="v2"))
    status, body, headers = await post(base, "/v1/completions", {"model": "m", "prompt": "x"},
                                       {"x-ferry-tier": "interactive"})
    assert status == 503 and body["error"]["code"] == "model_warming_up"
    assert "'v2' is warming up" in body["error"]["message"]
    assert 19 <= int(headers["Retry-After"]) <= 20


async def test_deadline_is_504(rig) -> None:
    r, base = await front(rig, {"h1": Behaviour(kind="hang")})
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "x"}, {"x-ferry-timeout": "0.2"})
    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    await asyncio.wait_for(r.replicas["h1"].cancelled.wait(), 5)


async def test_a_connection_that_sends_nothing_is_closed_after_the_keepalive(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()}, settings={"http_keepalive_seconds": 0.2})
    host, _, port = base.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, nothing sent
    finally:
        writer.close()


async def test_models_by_id_answers_one_model_or_404_model_not_found(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/v1/models/m", headers=AUTH) as resp:
            body = await resp.json()
            assert resp.status == 200 and isinstance(body["created"], int)
            assert body == {"id": "m", "object": "model", "created": body["created"], "owned_by": "ferry"}
        async with s.get(base + "/v1/models/nope%2Fx", headers=AUTH) as missing:
            error = (await missing.json())["error"]
            assert missing.status == 404 and error["code"] == "model_not_found" and error["param"] == "model"
            assert "'nope/x'" in error["message"]
        async with s.get(base + "/v1/models/m") as anonymous:
            assert anonymous.status == 401


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    ({"model": "m", "prompt": "x"}, {"Authorization": "Bearer nope"}, 401, "invalid_api_key"),
    ({"model": "nope", "prompt": "x"}, {}, 404, "model_not_found"),
    ({"model": "m", "prompt": "x", "temperature": "hot"}, {}, 400, "invalid_type"),
    ({"model": "m", "prompt": 7}, {}, 400, "invalid_type"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, {}, 400, "invalid_type"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, {}, 400, "invalid_value"),
    ({"model": "m"}, {}, 400, "invalid_value"),
    ({"model": "m", "prompt": "x", "max_tokens": 5000}, {}, 400, "context_length_exceeded"),  # replicas: 4,096
])
async def test_error_codes_are_openais(rig, body: Any, headers: dict[str, str], status: int, code: str) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    got, answer, _ = await post(base, "/v1/completions", body, headers)
    assert got == status and answer["error"]["code"] == code, answer


async def test_a_missing_key_is_explained_in_http_words(rig) -> None:
    _, base = await front(rig, {"r1": Behaviour()})
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/completions", json={"model": "m", "prompt": "x"}) as r:
        message = (await r.json())["error"]["message"]
    assert r.status == 401 and "Authorization: Bearer" in message and "metadata" not in message


async def test_rate_limit_headers_follow_the_tenants_buckets(rig) -> None:
    r, base = await front(rig, {"r1": Behaviour()})
    limited = [dataclasses.replace(t, requests_per_second=2.0, tokens_per_second=1000.0) if t.name == "acme" else t
               for t in TENANTS]
    r.proxy.authenticator.replace(limited)
    statuses, remaining = [], []
    for _ in range(3):
        status, _, headers = await post(base, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
        statuses.append(status)
        assert headers["x-ratelimit-limit-requests"] == "2" and headers["x-ratelimit-limit-tokens"] == "1000"
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(int(headers["x-ratelimit-remaining-requests"]))
    assert statuses[:2] == [200, 200] and statuses[2] == 429, statuses  # a bucket of 2 per second, 2 deep
    assert remaining[0] == 1 and remaining[2] == 0
    _, _, other = await post(base, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2},
                             {"Authorization": f"Bearer {KEYS['free']}"})
    assert not any(name.startswith("x-ratelimit-") for name in other)  # a tenant without limits: none
