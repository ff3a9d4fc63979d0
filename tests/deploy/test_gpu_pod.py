"""The GPU pod is shaped like a GPU node: 8 GPUs, registered as 8, and the gang allocator places chat-large on it.

The rendered pod asks for ``nvidia.com/gpu: 8`` and its agent says ``--gpus=8``; the catalog's
``chat-large`` needs 8. Then the single-region manifests' own commands run on loopback
(:mod:`tests.deploy.local`): one etcd, the two control planes, the two GPU pods (a stand-in for
Triton serving the small model ``chat`` pinned to one GPU by its instance group, the agent as the
manifest runs it). ``ferryctl`` with the rendered admin token shows each node with 8 GPUs, 7 free;
``ferryctl alloc chat-large --gpus 8`` places the gang on one of them, draining its ``chat``
replica, and ``ferryctl alloc chat --gpus 1 --replicas 7`` fills the other with single-GPU replicas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import discovered_id
from controlplane.config import Policy
from tests.deploy.conftest import find
from tests.deploy.local import Pod, StandIn, local_cluster
from tests.deploy.test_manifests import flag
from tests.e2e.harness import wait_for

GPUS = 8
SMALL, LARGE = "chat", "chat-large"


def gpu_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment", "triton")["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", ["overlays/single-region", "overlays/three-regions"])
def test_the_gpu_pod_asks_for_a_whole_8_gpu_node_and_says_so_to_its_agent(rendered, overlay) -> None:
    objects = rendered[overlay]
    pods = [o["spec"]["template"]["spec"] for o in objects
            if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "replica"]
    assert pods
    for pod in pods:
        by_name = {c["name"]: c for c in pod["containers"]}
        assert by_name["triton"]["resources"]["limits"]["nvidia.com/gpu"] == GPUS
        assert flag(by_name["agent"], "gpus") == str(GPUS)
        assert "podAntiAffinity" not in pod.get("affinity", {})  # the GPU request alone keeps one pod per node
    catalog = tomllib.loads(find(objects, "ConfigMap", "ferry-config")["data"]["ferry.toml"])["models"]
    assert {m["name"]: m.get("min_gpus", 1) for m in catalog} == {SMALL: 1, LARGE: GPUS}
    assert Policy().gang_gpus <= GPUS  # chat-large is a gang request: it may drain small replicas for room


def ctl(address: str, token: str, *args: str) -> Any:
    """``ferryctl --control-plane ADDRESS ARGS --json`` with the admin token in the environment."""
    env = {**os.environ, "FERRY_ADMIN_TOKEN": token}
    done = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--control-plane", address, *args, "--json"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.e2e
@pytest.mark.etcd
@pytest.mark.timeout(120)
def test_the_8_gpu_pod_registers_8_gpus_and_the_gang_allocator_places_chat_large_on_it(
        rendered, tmp_path: Path) -> None:
    objects = rendered["overlays/single-region"]
    with local_cluster(objects, tmp_path) as cluster:
        token = cluster.secret("ferry-tokens", "admin-token")
        control_planes = cluster.start_workload("controlplane")
        addresses = [pod.children["controlplane"].wait_ready()["grpc"] for pod in control_planes]
        address = addresses[0]

        def triton(pod: Pod) -> StandIn:
            return StandIn(f"{pod.name}-triton", "tests.deploy.standin", [SMALL, "--pin-gpus", "1"], tmp_path)

        pods = cluster.start_workload("triton", {"triton": triton})
        for pod in pods:
            pod.children["agent"].wait_ready()
        names = {pod.node for pod in pods}

        def nodes() -> dict[str, dict[str, Any]]:
            return {n["node"]: n for n in ctl(address, token, "nodes")}

        wait_for(lambda: {n: (v["gpus"], v["replicas"]) for n, v in nodes().items()} == dict.fromkeys(names, (8, 1)),
                 30, "both agents registered with 8 GPUs and their replica")
        assert {n: v["gpus_free"] for n, v in nodes().items()} == dict.fromkeys(names, 7)  # chat pins one GPU

        [slot] = ctl(address, token, "alloc", LARGE, "--gpus", str(GPUS))["slots"]
        assert slot["model"] == LARGE and slot["gpus"] == list(range(GPUS)) and slot["node"] in names
        assert slot["displaces"] == [discovered_id(slot["node"], SMALL, "v1")]  # the small replica drained for room
        (other,) = names - {slot["node"]}
        small = ctl(address, token, "alloc", SMALL, "--gpus", "1", "--replicas", "7")
        assert small["pending"] == [] and [s["node"] for s in small["slots"]] == [other] * 7
        assert {n: (v["gpus_allocated"], v["gpus_free"]) for n, v in nodes().items()} == dict.fromkeys(names, (8, 0))
