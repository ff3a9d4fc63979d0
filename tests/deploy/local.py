"""The rendered manifests' pods as local processes on loopback: what a cluster would run, as the manifests say.

:class:`LocalCluster` takes the rendered objects and starts each Ferry
container of a workload's pods (``spec.replicas`` of them) with the
manifest's own arguments and environment, the image's entry point
(``ENTRYPOINT ["ferry"]``, run as ``python -m ferry``) and its ConfigMap
files, changing only what a cluster provides and a laptop does not:

- the downward API: ``metadata.name`` is the pod's name, ``status.podIP``
  127.0.0.1, ``spec.nodeName`` a node name of the test, a pod label its value;
  ``secretKeyRef`` reads the rendered Secret; ``$(VAR)`` expands as the
  kubelet does;
- network namespaces: each pod's container ports get free local ports, and
  ``0.0.0.0:P`` or ``127.0.0.1:P`` in an argument or a mounted file becomes
  ``127.0.0.1:<the pod's port for P>``;
- Services: ``NAME:PORT`` becomes the comma-separated local addresses of the
  pods its selector picks (the components take a list of addresses where a
  cluster gives one virtual IP); the Service ``etcd`` is a :class:`harness.etcd.LocalEtcd`;
- a container of another image (Triton) is a stand-in given by the test,
  whose bound ports become the pod's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.procs import Child, stop_all
from harness.etcd import LocalEtcd, etcd_binary, free_port
from tests.deploy.test_dockerfile import RUN, args_of

Obj = dict[str, Any]
ADDRESS = re.compile(r"\b(?:0\.0\.0\.0|127\.0\.0\.1):(\d+)\b")
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
LABEL = re.compile(r"metadata\.labels\['([^']+)'\]")


class StandIn(Child):
    """A process in place of a container of another image: ``python -m MODULE ARGS --ready-file PATH``."""

    def __init__(self, name: str, module: str, args: list[str], workdir: Path) -> None:
        super().__init__(name, args, workdir)
        self.module = module

    def command(self) -> list[str]:
        """``python -m MODULE ARGS --ready-file PATH``."""
        return [sys.executable, "-m", self.module, *self.args, "--ready-file", str(self.ready_path)]


class Pod:
    """One pod of a workload: its name, labels, node, local ports and the processes of its containers."""

    def __init__(self, workload: Obj, index: int) -> None:
        self.workload = workload
        self.template: Obj = workload["spec"]["template"]
        self.index = index
        self.name = f"{workload['metadata']['name']}-{index}"
        self.node = f"k8s-node-{index + 1}"
        self.labels: dict[str, str] = self.template["metadata"]["labels"]
        self.ports = {p["containerPort"]: free_port() for c in self.template["spec"]["containers"]
                      for p in c.get("ports", [])}
        self.named = {p["name"]: p["containerPort"] for c in self.template["spec"]["containers"]
                      for p in c.get("ports", []) if "name" in p}
        self.children: dict[str, Child] = {}  # by container name


class LocalCluster:
    """Start :meth:`start_workload` for each workload in order; :attr:`children` are stopped by the test."""

    def __init__(self, objects: list[Obj], workdir: Path, entrypoint: list[str], etcd_endpoint: str) -> None:
        if entrypoint != ["ferry"]:
            raise ValueError(f"the image's entry point is {entrypoint}, this runner knows ['ferry']")
        self.objects = objects
        self.workdir = workdir
        self.etcd = etcd_endpoint
        self.pods: dict[str, list[Pod]] = {}
        self.children: list[Child] = []

    def find(self, kind: str, name: str) -> Obj:
        """The rendered object of ``kind`` named ``name``."""
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}"
        return found[0]

    def secret(self, prefix: str, key: str) -> str:
        """A key of the rendered Secret whose name is ``prefix`` with or without its hash suffix."""
        found = [o for o in self.objects if o["kind"] == "Secret" and re.fullmatch(
            rf"{re.escape(prefix)}(-[a-z0-9]{{10}})?", o["metadata"]["name"])]
        assert len(found) == 1, prefix
        return base64.b64decode(found[0]["data"][key]).decode()

    def service_addresses(self, name: str, port: int, turn: int = 0) -> str:
        """The local addresses behind Service ``name``'s ``port``: the pods its selector picks, the list
        turned by ``turn`` (the client pod's index), so that clients spread over them as a Service spreads."""
        if name == "etcd":
            return self.etcd
        service = self.find("Service", name)
        (entry,) = [p for p in service["spec"]["ports"] if p["port"] == port]
        selector = service["spec"]["selector"]
        picked = [pod for pods in self.pods.values() for pod in pods
                  if all(pod.labels.get(k) == v for k, v in selector.items())]
        assert picked, f"Service {name}: no pod started yet"
        target = entry.get("targetPort", port)
        turn %= len(picked)
        return ",".join(f"127.0.0.1:{p.ports[p.named[target] if isinstance(target, str) else target]}"
                        for p in picked[turn:] + picked[:turn])

    def localize(self, text: str, pod: Pod, env: dict[str, str]) -> str:
        """``text`` of a manifest (an argument, a mounted file) as it reads inside this pod on loopback."""
        text = VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)
        text = ADDRESS.sub(lambda m: f"127.0.0.1:{pod.ports.get(int(m.group(1)), int(m.group(1)))}", text)
        services = [o["metadata"]["name"] for o in self.objects if o["kind"] == "Service"]
        pattern = rf"\b({'|'.join(map(re.escape, services))})(?:\.[a-z0-9.-]*svc[a-z.]*)?:(\d+)\b"
        return re.sub(pattern, lambda m: self.service_addresses(m.group(1), int(m.group(2)), pod.index), text)

    def environment(self, container: Obj, pod: Pod) -> dict[str, str]:
        """The container's environment as the kubelet would give it (see the module docstring)."""
        env: dict[str, str] = {}
        for entry in container.get("env", []):
            source = entry.get("valueFrom")
            if source is None:
                value = entry["value"]
            elif "secretKeyRef" in source:
                value = self.secret(source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
            else:
                path = source["fieldRef"]["fieldPath"]
                label = LABEL.fullmatch(path)
                value = {"metadata.name": pod.name, "status.podIP": "127.0.0.1",
                         "spec.nodeName": pod.node}.get(path) or (pod.labels[label.group(1)] if label else "")
                assert value, f"{pod.name}: field {path}"
            env[entry["name"]] = VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), value)
        return env

    def mounts(self, container: Obj, pod: Pod, env: dict[str, str]) -> dict[str, str]:
        """Each ConfigMap mount path of the container, written under the pod's folder: mount path → folder."""
        volumes = {v["name"]: v for v in pod.template["spec"].get("volumes", [])}
        out = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "configMap" not in volume:
                continue
            config = self.find("ConfigMap", volume["configMap"]["name"])
            folder = self.workdir / pod.name / mount["mountPath"].strip("/")
            folder.mkdir(parents=True, exist_ok=True)
            for key, text in config["data"].items():
                (folder / key).write_text(self.localize(text, pod, env))
            out[mount["mountPath"]] = str(folder)
        return out

    def start_workload(self, name: str, stand_ins: dict[str, Callable[[Pod], StandIn]] | None = None) -> list[Pod]:
        """Start every pod of Deployment ``name``: stand-ins first (their ports become the pod's), then
        each Ferry container with its manifest's args and env. Returns the pods (children not yet ready)."""
        workload = self.find("Deployment", name)
        pods = [Pod(workload, i) for i in range(workload["spec"]["replicas"])]
        self.pods[name] = pods
        for pod in pods:
            for container in pod.template["spec"]["containers"]:
                if not container["image"].startswith("ferry:"):
                    stand_in = (stand_ins or {})[container["name"]](pod)
                    self.children.append(stand_in.start())
                    ready = stand_in.wait_ready()
                    grpc_port = int(ready["address"].rpartition(":")[2])
                    metrics_port = int(ready["metrics_url"].split(":")[2].split("/")[0])
                    pod.ports[pod.named["triton-grpc"]] = grpc_port
                    pod.ports[pod.named["triton-metrics"]] = metrics_port
            for container in pod.template["spec"]["containers"]:
                if not container["image"].startswith("ferry:"):
                    continue
                assert "command" not in container, "the image's entry point runs"
                env = self.environment(container, pod)
                mounts = self.mounts(container, pod, env)
                args = []
                for arg in container["args"]:
                    arg = self.localize(arg, pod, env)
                    for path, folder in sorted(mounts.items(), key=lambda m: -len(m[0])):
                        arg = arg.replace(path + "/", folder + "/")
                    args.append(arg)
                child = Child(f"{pod.name}-{container['name']}", args, self.workdir, env=env)
                self.children.append(child.start())
                pod.children[container["name"]] = child
        return pods


@contextlib.contextmanager
def local_cluster(objects: list[Obj], workdir: Path) -> Iterator[LocalCluster]:
    """A :class:`LocalCluster` of the rendered ``objects`` with the image's entry point (the Dockerfile's
    ENTRYPOINT) on a fresh local etcd; its children and the etcd are stopped on the way out. Fails the test
    where there is no etcd binary."""
    if etcd_binary() is None:
        pytest.fail("no etcd binary on PATH: run tools/ensure_etcd.sh (make test does)")
    (entrypoint,) = args_of(RUN, "ENTRYPOINT")
    etcd = LocalEtcd(log_path=workdir / "etcd.log").start()
    try:
        cluster = LocalCluster(objects, workdir, json.loads(entrypoint), etcd.endpoint)
        try:
            yield cluster
        finally:
            stop_all(cluster.children)
    finally:
        etcd.close()
