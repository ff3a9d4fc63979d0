"""Replicas on a node serve mutual TLS with the node's certificate: the batch runtime and a simulated replica."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import grpc
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from agent.batch.host import HostedRuntime, RuntimeSpec
from agent.replica.server import SimulatedReplica
from agent.triton import TritonEndpoint
from ferry import tls
from tests.agent.helpers import llm_inputs


@asynccontextmanager
async def batch_runtime(node: tls.TLSConfig) -> AsyncIterator[tuple[str, str]]:
    hosted = await HostedRuntime.start(RuntimeSpec(model="batchstring", gpus=1, max_wait_ms=0.0), tls=node)
    try:
        yield hosted.address, "batchstring"
    finally:
        await hosted.stop(grace=0.1)


@asynccontextmanager
async def simulated(node: tls.TLSConfig) -> AsyncIterator[tuple[str, str]]:
    async with SimulatedReplica("chat", tls=node) as replica:
        yield replica.address, "chat"


Server = Callable[[tls.TLSConfig], AbstractAsyncContextManager[tuple[str, str]]]
SERVERS: list[tuple[str, Server]] = [("batch-runtime", batch_runtime), ("simulated", simulated)]


@pytest.mark.parametrize("server", [s[1] for s in SERVERS], ids=[s[0] for s in SERVERS])
async def test_a_replica_answers_a_signed_client_and_refuses_others(
        pki: tuple[str, dict[str, tls.TLSConfig]], server: Server) -> None:
    _, certs = pki
    async with server(certs["agent"]) as (address, model):
        proxy = triton.InferenceServerClient(address, creds=certs["proxy"].channel_credentials())
        try:
            result = await proxy.infer(model, llm_inputs("hello", 2), timeout=10)
            assert result.as_numpy("text_output") is not None
        finally:
            await proxy.close()
        for creds in (None, grpc.ssl_channel_credentials(root_certificates=certs["proxy"].ca)):
            stranger = triton.InferenceServerClient(address, creds=creds)
            try:
                with pytest.raises(InferenceServerException):
                    await stranger.infer(model, llm_inputs("hello", 2), timeout=5)
            finally:
                await stranger.close()
        probe = TritonEndpoint(address, tls=certs["agent"])  # the agent polls its replicas over mutual TLS
        try:
            assert await probe.live()
        finally:
            await probe.close()
