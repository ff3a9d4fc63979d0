"""Replicas routable by their OpenAI HTTP address, with real processes over loopback.

A fleet's node serves a simulated ``chat`` replica, whose HTTP face ``ferry node``
starts by default and registers as the replica's ``http_address``. A second node,
``ferry node --openai URL --metrics URL --engine vllm``, adopts that HTTP face as
an external engine: its replica registers the HTTP address and no KServe address,
turns ready from ``/health``, and its table entry (as a proxy applies it, down to
the pick's :class:`dataplane.table.pool.Replica`) carries the ``http_address``. An
OpenAI client then streams a chat from that address, as an HTTP proxy forwarding to it would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import openai
import pytest

from agent.replica import tensors
from dataplane.table.local import build_table
from ferry.procs import Child
from ferry.v1 import tables_pb2, tables_pb2_grpc
from tools.process_fleet import Fleet

pytestmark = pytest.mark.timeout(60)


def watch_until(address: str, wanted: set[str], timeout: float = 20.0) -> tables_pb2.TableSnapshot:
    """Subscribe to region ``local``'s table as a proxy and return the first full table that routes ``wanted``."""
    done = threading.Event()

    def requests() -> Iterator[tables_pb2.WatchRequest]:
        yield tables_pb2.WatchRequest(subscribe=tables_pb2.Subscribe(proxy_id="test-watch", region="local"))
        done.wait(timeout)

    with grpc.insecure_channel(address) as channel:
        stream = tables_pb2_grpc.TablesStub(channel).Watch(requests(), timeout=timeout)
        try:
            for snapshot in stream:
                if {r.replica_id for m in snapshot.models for r in m.replicas} >= wanted:
                    return snapshot
        finally:
            done.set()
            stream.cancel()
    raise AssertionError(f"no table routed {wanted} within {timeout} s")


def test_an_openai_http_replica_reaches_the_table_with_its_http_address(make_fleet) -> None:
    fleet: Fleet = make_fleet({"sim": ["chat"]})
    (listed,) = fleet.nodes["sim"].ready["replicas"]
    face = listed["http"]
    external = Child("ext", ["node", "--node", "ext", "--control-plane", fleet.cp_address,
                             "--openai", f"http://{face}", "--metrics", f"http://{listed['metrics']}/metrics",
                             "--engine", "vllm", "--config", str(fleet.config_path), "--insecure"],
                     fleet.workdir).start()
    fleet.children.append(external)  # stopped with the fleet
    external.wait_ready()

    table = watch_until(fleet.cp_address, {"sim-r0", "ext-o0-chat-v1"})
    rows = {r.replica_id: r for m in table.models for r in m.replicas}
    assert (rows["sim-r0"].address, rows["sim-r0"].http_address, rows["sim-r0"].engine) == (
        listed["address"], face, "simulated")
    ext = rows["ext-o0-chat-v1"]
    assert (ext.address, ext.http_address, ext.engine, ext.kserve_model) == ("", face, "vllm", "chat")

    applied = build_table(table, region="local", applied_at=0.0)
    _, pool = applied.candidates("chat", "v1")
    assert {r.replica_id: (r.address, r.http_address) for r in pool}["ext-o0-chat-v1"] == ("", face)

    client = openai.OpenAI(base_url=f"http://{ext.http_address}/v1", api_key="unused", max_retries=0, timeout=10)
    chunks = list(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "one two three"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == tensors.generated_text(0, 4)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert all(c.usage is None for c in chunks[:-1])
