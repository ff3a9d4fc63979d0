"""The fleet as the simulator sees it, end to end: real replicas stepping in real time, their agent, a control plane,
``ferryctl engines --json``; the fitted step parameters come back within 10 % of what the replicas run.

Two simulated replicas of one kind (non-default parameters) on one node, its agent telemetry every 0.2 s to an
in-process control plane, a varied load for about four seconds straight into the replicas' runners (bursts and
pauses, prompts of 0 to 3,000 uncached tokens, answers of 1 to 40 tokens), then the leader's fit read through
ferryctl and turned back into ``EngineParams`` with :func:`ferry_cli.ctl.engines.fitted_params`. The runner steps
on the model's clock (agent.replica.runner), so the wall time the fit sees is the modelled time plus at most one
step's lateness per busy period: 10 % holds on a loaded 2-core machine (the fit's own error is printed).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, Endpoint, NodeInfo
from agent.config import AgentSettings
from agent.inventory import ReplicaSpec
from agent.replica.engine import EngineParams
from agent.replica.server import SimulatedReplica
from ferry.v1 import admin_pb2
from ferry_cli.ctl import main as ferryctl
from ferry_cli.ctl.engines import STEP_PARAMS, fitted_params
from tests.controlplane.fakes import TOKEN, Harness

TRUE = EngineParams(
    max_running=12, max_queue=512, kv_block_tokens=64, kv_blocks_total=3000, prefix_cache_blocks=0,
    prefill_base_seconds=0.004, prefill_seconds_per_token=30e-6, decode_base_seconds=0.007,
    decode_seconds_per_request=0.0006, max_context_tokens=8192, max_step_tokens=1536,
)
LOAD_SECONDS = 4.0


async def drive(replicas: list[SimulatedReplica], seconds: float, rng: random.Random) -> int:
    """A varied load on each replica's runner for ``seconds``: clients that come and go, bursts and pauses."""
    done = 0
    end = time.monotonic() + seconds

    async def client(replica: SimulatedReplica, k: int) -> None:
        nonlocal done
        runner = replica.runner
        assert runner is not None
        while time.monotonic() < end:
            if rng.random() < 0.3:  # a pause: some intervals run few requests, or none
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                continue
            prompt = rng.choice((0, rng.randint(1, 200), rng.randint(200, 3000)))
            ticket = runner.submit(prompt, rng.randint(1, 40), ())
            while (await ticket.next())[1] is None:
                pass
            done += 1

    await asyncio.gather(*(client(r, k) for r in replicas for k in range(rng.randint(6, 14))))
    return done


async def test_the_fit_of_real_replicas_is_within_ten_percent_of_their_settings(capsys) -> None:
    harness = await Harness.start(time.monotonic, telemetry_interval_seconds=0.2)  # type: ignore[arg-type]
    replicas = [SimulatedReplica("chat", "v1", params=TRUE, replica_id=f"n1-r{i}") for i in range(2)]
    agent = None
    try:
        for r in replicas:
            await r.start()
        specs = [ReplicaSpec(replica_id=r.replica_id, model="chat", version="v1", address=r.address,
                             max_concurrency=TRUE.max_running, kv_block_tokens=TRUE.kv_block_tokens,
                             max_context_tokens=TRUE.max_context_tokens, engine="simulated") for r in replicas]
        agent = Agent(node=NodeInfo(node="n1", gpus=2), control_planes=[f"127.0.0.1:{harness.cp.port}"],
                      endpoints=[Endpoint(address=r.address, metrics_url=r.metrics_url, replicas=(s,))
                                 for r, s in zip(replicas, specs, strict=True)],
                      settings=AgentSettings(telemetry_interval_seconds=0.2, probe_timeout_seconds=0.5),
                      rng=random.Random(1), metrics=AgentMetrics(CollectorRegistry()))
        await agent.start()
        deadline = time.monotonic() + 10
        while not agent.connected:  # registered: the control plane holds the replicas
            assert time.monotonic() < deadline, "the agent did not register"
            await asyncio.sleep(0.02)
        served = await drive(replicas, LOAD_SECONDS, random.Random(5))
        assert served > 50
        steps = sum(r.runner.engine.load().steps for r in replicas if r.runner is not None)

        async def fitted() -> admin_pb2.EngineFitView | None:
            reply = await harness.admin.GetEngines(admin_pb2.GetEnginesRequest(model="chat"), timeout=5)
            view = reply.engines[0] if reply.engines else None
            return view if view is not None and view.sampled_replicas == 2 and view.samples >= 20 else None

        deadline = time.monotonic() + 10
        while await fitted() is None:
            assert time.monotonic() < deadline, "no fit of both replicas"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the last intervals' samples: sent within two telemetry intervals
        capsys.readouterr()
        code = await asyncio.to_thread(ferryctl.main, ["--control-plane", f"127.0.0.1:{harness.cp.port}",
                                                       "--admin-token", TOKEN, "engines", "--json"])
        assert code == 0
        (row,) = json.loads(capsys.readouterr().out)["engines"]
    finally:
        if agent is not None:
            await agent.stop()
        for r in replicas:
            await r.stop()
        await harness.stop()
    assert (row["model"], row["kind"], row["replicas"]) == ("chat", "simulated/1gpu/v1", ["n1-r0", "n1-r1"])
    params = fitted_params(row)
    errors = {name: getattr(params, name) / getattr(TRUE, name) - 1 for name in STEP_PARAMS}
    print(f"{steps} steps, {row['samples']} samples, fit {row['fit']}, relative errors "
          + ", ".join(f"{k} {100 * v:+.2f}%" for k, v in errors.items()))
    assert all(abs(e) < 0.10 for e in errors.values()), errors
    assert not row["unidentifiable"]
    assert (params.kv_blocks_total, params.kv_block_tokens, params.max_running, params.max_step_tokens) == (
        TRUE.kv_blocks_total, TRUE.kv_block_tokens, TRUE.max_running, TRUE.max_step_tokens)
    assert row["fit"]["r2"] > 0.99
