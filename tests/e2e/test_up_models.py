"""``ferry up``'s ready file lists the models actually served (with a replica in the tables), not ``--models``:
an adopted KServe v2 endpoint brings its own, and a model given no replica is not served."""

from __future__ import annotations

import sys
from pathlib import Path

from ferry.procs import Child, stop_all
from ferry_cli.up.ready import ordered_models


class Replicas(Child):
    """Standalone simulated replicas (:mod:`tools.peers.replicas`): a KServe v2 endpoint to adopt."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tools.peers.replicas", "--count", "1", "--model", "llm-sim",
                "--ready-file", str(self.ready_path)]


def test_the_models_served_keep_the_asked_order_then_the_others_sorted() -> None:
    assert ordered_models(["chat-large", "chat-small"], {"chat-small"}) == ["chat-small"]
    assert ordered_models(["chat-large", "chat-small"], {"zeta", "alpha"}) == ["alpha", "zeta"]
    assert ordered_models(["b", "a"], {"a", "b", "c"}) == ["b", "a", "c"]


def test_ferry_up_with_an_adopted_endpoint_lists_its_models_not_the_default_ones(tmp_path: Path) -> None:
    endpoint = Replicas("replicas", [], tmp_path).start()
    children: list[Child] = [endpoint]
    try:
        replica = endpoint.wait_ready()["replicas"][0]
        up = Child("up", ["up", "--triton", f"{replica['grpc']},{replica['metrics']}", "--workdir",
                          str(tmp_path / "up")], tmp_path).start()
        children.append(up)
        assert up.wait_ready(90)["models"] == ["llm-sim"]
    finally:
        stop_all(children, timeout=15)


def test_ferry_up_lists_only_the_models_given_a_replica(tmp_path: Path) -> None:
    up = Child("up", ["up", "--replicas", "1", "--workdir", str(tmp_path / "up")], tmp_path).start()
    try:
        assert up.wait_ready(90)["models"] == ["chat-large"]  # replica i serves models[i % 2]: one replica, one model
    finally:
        up.stop(timeout=15)
