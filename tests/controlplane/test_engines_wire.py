"""Engine samples on the wire: out of the loads an agent sends, refused when hostile, and relayed by a follower so
that the leader's fit sees every node (two control planes on one store, real gRPC)."""

from __future__ import annotations

import asyncio
import time

import grpc

from ferry.v1 import admin_pb2, common_pb2
from tests.controlplane.fakes import WAIT, FakeAgent, Harness, Pair, register, replica


def loaded(rid: str, k: int, **sample: float) -> common_pb2.ReplicaLoad:
    """A load with an engine sample of step time exactly 2 ms x prefill steps + 10 µs x tokens + 5 ms x decode steps
    + 0.1 ms x requests decoding, its counts varied by ``k``."""
    sp, p, sd, d = 1 + k % 3, 100 * (1 + k % 5) + 7 * k, 2 + k % 4, 3 * (2 + k % 4) + k % 7
    fields = {"prefill_steps": sp, "prefill_tokens": p, "decode_steps": sd, "decode_tokens": d,
              "step_seconds": 0.002 * sp + 1e-5 * p + 0.005 * sd + 1e-4 * d, "intervals": 1,
              "kv_blocks_total": 512, "kv_block_tokens": 16, "max_running": 8, "max_step_tokens": 2048}
    fields.update(sample)
    return common_pb2.ReplicaLoad(replica_id=rid, state=common_pb2.REPLICA_STATE_READY,
                                  engine=common_pb2.EngineSample(**fields))  # type: ignore[arg-type]


async def engines(admin, samples: int, replicas: int = 1) -> admin_pb2.GetEnginesResponse:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT
    while True:
        reply = await admin.GetEngines(admin_pb2.GetEnginesRequest(), timeout=WAIT)
        if (sum(v.samples for v in reply.engines) >= samples
                and sum(v.sampled_replicas for v in reply.engines) >= replicas):
            return reply
        assert time.monotonic() < deadline, f"fewer than {samples} samples: {reply}"
        await asyncio.sleep(0.02)


async def test_an_agents_samples_are_fitted_and_kept_out_of_the_tables(clock) -> None:  # type: ignore[no-untyped-def]
    h = await Harness.start(clock)
    try:
        agent = h.agent()
        await agent.register(register("n1", replica("n1/r0", engine="simulated"), replica("n1/r1")))
        for k in range(12):
            await agent.telemetry(loaded("n1/r0", k), common_pb2.ReplicaLoad(replica_id="n1/r1"))
        reply = await engines(h.admin, 12)
        views = {v.kind: v for v in reply.engines}
        assert set(views) == {"simulated/1gpu/v1", "unknown/1gpu/v1"} and reply.leading
        fitted = {p.name: p.value for p in views["simulated/1gpu/v1"].params}
        assert abs(fitted["prefill_seconds_per_token"] / 1e-5 - 1) < 1e-6
        assert abs(fitted["decode_base_seconds"] / 0.005 - 1) < 1e-6
        assert views["unknown/1gpu/v1"].samples == 0  # n1/r1 sends no sample: "no samples"
        assert views["simulated/1gpu/v1"].max_step_tokens == 2048
        view = (await h.replicas())["n1/r0"]
        assert not view.load.HasField("engine")  # taken out on arrival
        await agent.telemetry(loaded("n1/r0", 0, step_seconds=float("inf")))
        code, details = await agent.status()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "telemetry.replicas[0].engine.step_seconds" in details
        try:
            await h.admin.GetEngines(admin_pb2.GetEnginesRequest(model="bad model"), timeout=WAIT)
            raise AssertionError("a model filter with a space was taken")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "model" in (exc.details() or "")
    finally:
        await h.stop()


async def test_the_leaders_fit_sees_the_followers_nodes(pair: Pair) -> None:
    agents = [FakeAgent(pair.channels[0]), FakeAgent(pair.channels[1])]
    await agents[0].register(register("n1", replica("n1/r0", engine="simulated")))
    await agents[1].register(register("n2", replica("n2/r0", engine="simulated")))
    for k in range(10):
        await agents[0].telemetry(loaded("n1/r0", k))
        await agents[1].telemetry(loaded("n2/r0", k + 10))
    # The leader: both nodes' samples, cp2's relayed over Follow (one per replica per report: the intervals that
    # arrived within a tick summed, which the linear model fits alike).
    reply = await engines(pair.admin(0), 11, replicas=2)
    (view,) = reply.engines
    assert list(view.replica_ids) == ["n1/r0", "n2/r0"] and view.sampled_replicas == 2 and reply.leading
    assert abs({p.name: p.value for p in view.params}["decode_seconds_per_request"] / 1e-4 - 1) < 1e-6
    follower = await pair.admin(1).GetEngines(admin_pb2.GetEnginesRequest(), timeout=WAIT)
    assert not follower.leading and follower.engines[0].samples == 10  # its own node's samples only
