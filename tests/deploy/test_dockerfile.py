"""The Dockerfile, read (no container runtime here): stages, base, what is installed, the user, the entry point."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest

from tests.deploy.conftest import ROOT, find

PACKAGES = ("ferry", "ferry_cli", "harness", "controlplane", "dataplane", "agent", "tools")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(word.upper(), rest.strip()) for line in joined.splitlines() if line.strip()
            for word, _, rest in [line.strip().partition(" ")]]


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each stage (an ARG before the first FROM counts with the first)."""
    out: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions(text):
        if instruction[0] == "FROM" and any(i[0] == "FROM" for i in out[-1]):
            out.append([])
        out[-1].append(instruction)
    return out


DOCKERFILE = (ROOT / "Dockerfile").read_text()
BUILD, RUN = stages(DOCKERFILE)


def args_of(stage: list[tuple[str, str]], name: str) -> list[str]:
    """The arguments of each ``name`` instruction of ``stage``."""
    return [rest for word, rest in stage if word == name]


def test_two_stages_on_a_slim_python_311_base() -> None:
    (default,) = [rest.split("=", 1)[1] for word, rest in instructions(DOCKERFILE) if word == "ARG"
                  and rest.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", default)
    assert args_of(BUILD, "FROM") == ["${PYTHON_IMAGE} AS build"]
    assert args_of(RUN, "FROM") == ["${PYTHON_IMAGE}"]


def test_the_build_installs_the_project_from_wheels_of_its_pinned_versions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\[\]-]+==[\w.]+", d) for d in project["dependencies"]), \
        "every runtime dependency is pinned with =="
    assert project["scripts"]["ferry"] == "ferry_cli.main:main"
    copied = {rest.split()[0] for rest in args_of(BUILD, "COPY")}
    assert copied == {"pyproject.toml", *PACKAGES}
    (run,) = args_of(BUILD, "RUN")
    assert "pip wheel --wheel-dir /wheels ." in run
    assert "pip install --no-index --find-links /wheels ferry" in run, "the environment from those wheels alone"


def test_the_image_runs_ferry_as_a_user_that_is_not_root() -> None:
    (user,) = args_of(RUN, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, "numeric, so runAsNonRoot can check"
    assert json.loads(args_of(RUN, "ENTRYPOINT")[0]) == ["ferry"]
    assert args_of(RUN, "COPY") == ["--from=build /opt/ferry /opt/ferry"]
    assert not any("pip" in rest for rest in args_of(RUN, "RUN")), "nothing installed in the runtime stage"
    assert any(rest.startswith("PATH=/opt/ferry/bin:") for rest in args_of(RUN, "ENV"))
    last_user = max(i for i, (word, _) in enumerate(RUN) if word == "USER")
    assert all(word != "RUN" for word, _ in RUN[last_user:]), "no command runs after USER as another user"


def test_the_dockerignore_keeps_environments_and_history_out() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".venv-*", "bench-results", "traces", "tests"} <= ignored
    assert not ignored & {"pyproject.toml", *PACKAGES}


@pytest.mark.parametrize("overlay", ["overlays/single-region", "overlays/three-regions"])
def test_the_manifests_run_the_image_entry_point_as_the_pods_own_non_root_user(rendered, overlay) -> None:
    (user,) = args_of(RUN, "USER")
    uid = int(user.partition(":")[0])
    for obj in rendered[overlay]:
        if obj["kind"] != "Deployment":
            continue
        pod: dict[str, Any] = obj["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if not container["image"].startswith("ferry:"):
                continue
            context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            assert context["runAsNonRoot"] is True and context["runAsUser"] == uid
            assert "command" not in container, "the image's ENTRYPOINT (ferry) runs"
            assert container["args"][0] in ("controlplane", "proxy", "node", "envoy", "picker")
    assert find(rendered[overlay], "Deployment", "controlplane")
