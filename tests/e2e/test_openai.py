"""The HTTP front door end to end with the official ``openai`` client against a real ``ferry up`` fleet.

One fleet for the module (2 nodes x 2 simulated ``chat`` replicas, a fast engine); the test that SIGKILLs a
node mid-stream runs last.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child
from ferry.v1 import admin_pb2
from ferry_cli.ctl.client import AdminClient
from tests.e2e.harness import wait_for
from tools.process_fleet import FAST_REPLICA

TOKENS = 1500  # ~3 s at 2 ms decode steps: long enough to find and kill the node running it
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


class Up:
    """A ``ferry up`` run with known tenants: ``ent`` (enterprise) and ``tight`` (one request at a time)."""

    def __init__(self, workdir: Path) -> None:
        self.keys = {"ent": "fk_" + secrets.token_hex(8), "tight": "fk_" + secrets.token_hex(8)}
        config = {
            "tenants": [{"name": "ent", "api_key_sha256": hash_api_key(self.keys["ent"]), "plan": "enterprise"},
                        {"name": "tight", "api_key_sha256": hash_api_key(self.keys["tight"]), "plan": "paid",
                         "max_concurrency": 1}],
            "models": [{"name": "chat", "min_gpus": 1, "chat_template": TEMPLATE}],
            "replica": dict(FAST_REPLICA),
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "user.toml").write_text(dumps(config))
        # --answer-tokens 0: answers run to max_tokens, whose exact counts these tests check (a stream continued
        # on another replica ends at its budget, not at a natural end drawn from the continuation's prompt).
        self.child = Child("up", ["up", "--replicas", "4", "--models", "chat", "--config",
                                  str(workdir / "user.toml"), "--answer-tokens", "0", "--workdir",
                                  str(workdir / "fleet")], workdir).start()
        self.ready: dict[str, Any] = self.child.wait_ready(90)

    def client(self, tenant: str = "ent", key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{self.ready['http']}/v1", api_key=key or self.keys[tenant],
                             max_retries=0, timeout=30)

    def replicas(self) -> list[Any]:
        with grpc.insecure_channel(self.ready["control_plane"]) as channel:
            admin = AdminClient(channel, self.ready["admin_token"])
            return list(admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5).replicas)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    run = Up(tmp_path_factory.mktemp("openai"))
    try:
        yield run
    finally:
        run.child.stop()


def test_models_list_names_the_fleet_models(up: Up) -> None:
    assert [m.id for m in up.client().models.list()] == ["chat"]


def test_completion_unary_with_usage_and_request_id(up: Up) -> None:
    raw = up.client().completions.with_raw_response.create(model="chat", prompt="hello there", max_tokens=5)
    answer = raw.parse()
    assert raw.headers["x-request-id"] and answer.id.endswith(raw.headers["x-request-id"])
    assert answer.choices[0].finish_reason == "length" and len(answer.choices[0].text.split()) == 5
    assert answer.usage is not None and answer.usage.completion_tokens == 5 and answer.usage.prompt_tokens == 2


def test_chat_unary_honours_stop(up: Up) -> None:
    answer = up.client().chat.completions.create(model="chat", max_tokens=8, stop=["river"],
                                                 messages=[{"role": "user", "content": "sing"}])
    assert answer.choices[0].message.content == "the ferry crosses a"
    assert answer.choices[0].finish_reason == "stop" and answer.usage is not None
    assert answer.usage.completion_tokens == 4 and answer.usage.prompt_tokens == 3  # "user: sing\nassistant:"


def test_streams_completion_and_chat(up: Up) -> None:
    client = up.client()
    pieces = list(client.completions.create(model="chat", prompt="a b", max_tokens=6, stream=True))
    assert "".join(p.choices[0].text for p in pieces).split() == ["the", "ferry", "crosses", "a", "river", "of"]
    assert pieces[-1].choices[0].finish_reason == "length" and all(p.usage is None for p in pieces)  # not asked
    chunks = list(client.chat.completions.create(model="chat", max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["the", "ferry", "crosses", "a", "river", "of"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks[:-1])


def test_a_model_is_retrieved_by_id(up: Up) -> None:
    assert up.client().models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError) as missing:
        up.client().models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_unknown_key_is_401_and_unknown_model_404(up: Up) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        up.client(key="fk_wrong").completions.create(model="chat", prompt="x", max_tokens=1)
    assert denied.value.status_code == 401 and denied.value.response.headers["x-request-id"]
    with pytest.raises(openai.NotFoundError) as missing:
        up.client().completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert missing.value.status_code == 404 and "no-such-model" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        up.client().completions.create(model="chat", prompt="x", max_tokens=1, temperature=9)
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]


def test_overload_is_429_with_retry_after(up: Up) -> None:
    client = up.client("tight")
    stream = client.completions.create(model="chat", prompt="hold", max_tokens=TOKENS, stream=True)
    try:
        next(iter(stream))  # the tenant's one slot is taken
        with pytest.raises(openai.RateLimitError) as limited:
            client.completions.create(model="chat", prompt="x", max_tokens=1)
        assert limited.value.status_code == 429 and int(limited.value.response.headers["retry-after"]) >= 1
    finally:
        stream.close()  # the client goes away: the request is cancelled upstream, the slot comes back
    wait_for(lambda: _ok(client), 10, "the tenant's slot to come back after the disconnect")


def _ok(client: openai.OpenAI) -> bool:
    try:
        client.completions.create(model="chat", prompt="x", max_tokens=1)
        return True
    except openai.RateLimitError:
        return False


def test_a_stream_continues_across_a_replica_killed_midway(up: Up) -> None:
    stream = up.client().chat.completions.create(model="chat", max_tokens=TOKENS, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "a long one"}])
    chunks = iter(stream)
    got = [next(chunks), next(chunks)]
    busy = wait_for(lambda: next((r for r in up.replicas() if r.load.running > 0), None), 5,
                    "the replica running the stream to report it")
    os.kill(up.ready["pids"][busy.node], signal.SIGKILL)  # the node's agent and replicas die mid-stream
    got.extend(chunks)
    final = got[-1]
    assert got[-2].choices[0].finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == TOKENS
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    # one unbroken stream: every word, the continuation's first one glued to the last delivered (the simulated
    # replica starts its reply without a space), hence one seam
    assert len(text.split()) in (TOKENS, TOKENS - 1)
