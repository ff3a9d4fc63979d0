"""The request path end to end over loopback: real processes, real gRPC, simulated replicas."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet

LIMITS = {"max_prompt_bytes": 100_000, "max_tokens": 4096}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"), {"node-a": ["chat:v1", "chat:v1"], "node-b": ["chat:v1"]},
              config={"limits": LIMITS})
    try:
        yield f.start()
    finally:
        f.stop()


def request(**kw: object) -> inference_pb2.InferRequest:
    fields = {"model": "chat", "prompt": "the quick brown fox", "max_tokens": 8,
              "tier": common_pb2.TIER_INTERACTIVE, **kw}
    return inference_pb2.InferRequest(**fields)  # type: ignore[arg-type]


def test_unary_and_stream(fleet: Fleet) -> None:
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        reply = stub.Infer(request(), metadata=key, timeout=10)
        assert reply.completion_tokens == 8 and len(reply.text.split()) == 8
        assert reply.replica_id in fleet.replica_ids() and reply.region == "local"
        assert reply.prompt_tokens == 4 and reply.attempts == 1 and reply.request_id
        chunks = list(stub.InferStream(request(max_tokens=12), metadata=key, timeout=10))
        assert chunks[-1].final and not any(c.final for c in chunks[:-1])
        assert len(chunks) > 2, "tokens must arrive as several chunks"
        text = "".join(c.text for c in chunks[:-1])
        assert len(text.split()) == 12 == chunks[-1].summary.completion_tokens


def test_prefix_cache_hits_show_in_responses(fleet: Fleet) -> None:
    key = (("x-api-key", fleet.keys["ent"]),)
    prompt = " ".join(f"w{i}" for i in range(2048))
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        replies = [stub.Infer(request(prompt=prompt, max_tokens=2), metadata=key, timeout=10) for _ in range(6)]
    assert all(r.prompt_tokens == 2048 for r in replies)
    assert max(r.cached_prompt_tokens for r in replies) >= 1536, "a repeated prompt must hit some replica's cache"


BAD = [
    ("no-key", {}, None, "UNAUTHENTICATED", "x-api-key"),
    ("wrong-key", {}, "fk_wrong", "UNAUTHENTICATED", ""),
    ("no-model", {"model": ""}, "ent", "INVALID_ARGUMENT", "model"),
    ("no-prompt", {"prompt": ""}, "ent", "INVALID_ARGUMENT", "prompt"),
    ("too-many-tokens", {"max_tokens": 100_000}, "ent", "INVALID_ARGUMENT", "max_tokens"),
    ("prompt-too-big", {"prompt": "x " * 60_000}, "ent", "INVALID_ARGUMENT", "prompt"),
    ("unknown-tier", {"tier": 42}, "ent", "INVALID_ARGUMENT", "tier"),
    ("long-model-name", {"model": "m" * 500}, "ent", "INVALID_ARGUMENT", "model"),
    ("long-idempotency-key", {"idempotency_key": "k" * 1000}, "ent", "INVALID_ARGUMENT", "idempotency_key"),
    ("unknown-model", {"model": "no-such-model"}, "ent", "NOT_FOUND", "no-such-model"),
    ("unknown-version", {"version": "v9"}, "ent", "NOT_FOUND", "v9"),
    ("tier-not-in-plan", {}, "free", "PERMISSION_DENIED", "interactive"),
    ("no-ready-replica", {"model": "empty-model"}, "ent", "UNAVAILABLE", "empty-model"),
]


@pytest.mark.parametrize(("fields", "key", "status", "named"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
def test_bad_input_gets_its_status(fleet: Fleet, fields: dict, key: str | None, status: str, named: str,
                                   streaming: bool) -> None:
    metadata = () if key is None else (("x-api-key", fleet.keys.get(key, key)),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        with pytest.raises(grpc.RpcError) as info:
            if streaming:
                list(stub.InferStream(request(**fields), metadata=metadata, timeout=10))
            else:
                stub.Infer(request(**fields), metadata=metadata, timeout=10)
    assert info.value.code().name == status
    assert named in info.value.details()


def test_deadline_exceeded_and_the_replica_is_freed(fleet: Fleet) -> None:
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch, pytest.raises(grpc.RpcError) as info:
        fleet.inference(ch).Infer(request(max_tokens=4000), metadata=key, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_overload_gets_resource_exhausted_with_retry_after(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]}, config={"proxy": {"max_inflight": 2}})
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)

        def one(_: int) -> tuple[str, dict[str, str]]:
            try:
                stub.Infer(request(max_tokens=200), metadata=key, timeout=20)
                return "OK", {}
            except grpc.RpcError as exc:
                return exc.code().name, dict(exc.trailing_metadata() or ())

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(one, range(8)))
    statuses = Counter(s for s, _ in outcomes)
    assert statuses["OK"] >= 2 and statuses["RESOURCE_EXHAUSTED"] >= 1, statuses
    assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert all(float(md["retry-after"]) > 0 for s, md in outcomes if s == "RESOURCE_EXHAUSTED")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True, timeout=60)


def run_ctl(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from ferry_cli.ctl.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_ferry_call_cli(fleet: Fleet) -> None:
    base = ["call", "--data-plane", fleet.data_plane, "--api-key", fleet.keys["ent"], "--model", "chat"]
    ok = run_cli(*base, "--prompt", "hello there", "--max-tokens", "5", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["completion_tokens"] == 5
    streamed = run_cli(*base, "--prompt", "hello there", "--max-tokens", "5", "--stream")
    assert streamed.returncode == 0 and len(streamed.stdout.split()) == 5, streamed
    bad = run_cli("call", "--data-plane", fleet.data_plane, "--model", "chat", "--prompt", "x")
    assert bad.returncode == 1 and bad.stderr.startswith("UNAUTHENTICATED"), bad.stderr


def test_ferryctl_replicas_and_table(fleet: Fleet) -> None:
    cp = ("--control-plane", fleet.cp_address, "--admin-token", fleet.admin_token)
    listing = run_ctl(*cp, "replicas", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {r["id"] for r in rows} == fleet.replica_ids()
    assert all(r["model"] == "chat" and r["state"] == "ready" for r in rows)
    human = run_ctl("replicas", *cp)
    assert human.returncode == 0 and "node-a-r0" in human.stdout and "STATE" in human.stdout

    def synced() -> bool:  # versions move with load ticks: the proxy must catch up, not be caught mid-push
        data = json.loads(run_ctl(*cp, "--json", "table").stdout)
        return bool(data["proxies"][0]["applied_version"] == data["regions"][0]["version"])

    wait_for(synced, 10, "the proxy to apply the region's current table version")
    assert run_ctl(*cp, "table").returncode == 0
    missing = run_ctl(*cp, "drain", "no-such-replica")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_ferryctl_unreachable_control_plane() -> None:
    result = run_ctl("--control-plane", "127.0.0.1:1", "replicas")
    assert result.returncode == 2 and "unreachable" in result.stderr
