"""A standby node (``ferry node --standby``): registers with no replica and the standby flag, keeps reporting."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, NodeInfo
from agent.main import main
from controlplane import validate
from controlplane.config import ControlPlaneSettings
from ferry.errors import InvalidArgument
from tests.agent.test_agent import SETTINGS, FakeFleet, start_fleet
from tests.controlplane.fakes import register, replica


async def test_a_standby_node_registers_with_no_replica_and_keeps_reporting() -> None:
    fake = FakeFleet()
    server, port = await start_fleet(fake)
    agent = Agent(node=NodeInfo(node="spare-1", region="eu", gpus=8, standby=True),
                  control_planes=[f"127.0.0.1:{port}"], endpoints=[], settings=SETTINGS, rng=random.Random(7),
                  metrics=AgentMetrics(CollectorRegistry()))
    try:
        await agent.start()
        _, register = await fake.next("register")
        assert (register.node, register.region, register.gpus, register.standby) == ("spare-1", "eu", 8, True)
        assert list(register.replicas) == []
        _, telemetry = await fake.next("telemetry")
        assert list(telemetry.replicas) == []
    finally:
        await agent.stop()
        await server.stop(None)


@pytest.mark.parametrize("extra", [["--replica", "chat"], ["--triton", "127.0.0.1:1"], ["--batch-runtime"]])
def test_standby_refuses_weights(extra: list[str], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FERRY_CONTROL_PLANE", raising=False)
    assert main(["--control-plane", "127.0.0.1:1", "--standby", "--insecure", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ferry node: --standby") and extra[0] in err


def test_a_standby_registration_with_replicas_is_refused_naming_the_field() -> None:
    reg = register("n1", replica("n1-r0"))
    reg.standby = True
    with pytest.raises(InvalidArgument) as info:
        validate.check_register(reg, ControlPlaneSettings())
    assert info.value.field == "register.standby"
    alone = register("n1")
    alone.standby = True
    validate.check_register(alone, ControlPlaneSettings())  # a standby node alone is fine
