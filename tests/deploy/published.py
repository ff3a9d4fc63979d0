"""The custom resources' fields as their projects publish them, and ``kubectl kustomize`` to render.

:data:`SCHEMAS` maps each custom kind these tests check to a JSON Schema in
``schemas/``, written from the published CRD's ``openAPIV3Schema`` (each file's
header names the repository, tag, commit and path it was read from).
:func:`errors` validates one object with ``jsonschema`` (draft 2020-12) and
returns its errors, each naming the kind, the object and the field's path;
:func:`all_errors` checks a whole render, the core kinds with
``kubernetes-validate``.

:func:`kustomize` renders a Kustomize directory with the real ``kubectl
kustomize`` (Kustomize 5.5 in kubectl 1.32); a test module calls
:func:`require_kubectl` first, which skips it where the binary is absent.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
SCHEMAS = {
    "InferencePool": "inferencepool.yaml",
    "HTTPRoute": "httproute.yaml",
    "Gateway": "gateway.yaml",
    "ServiceMonitor": "servicemonitor.yaml",
    "PodMonitor": "podmonitor.yaml",
    "PrometheusRule": "prometheusrule.yaml",
}
RENDER_TIMEOUT_SECONDS = 60


@cache
def validator(kind: str) -> jsonschema.Draft202012Validator:
    """The validator of ``kind`` (KeyError for a kind without a schema here)."""
    schema = yaml.safe_load((SCHEMAS_DIR / SCHEMAS[kind]).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(obj: dict[str, Any]) -> list[str]:
    """Where ``obj`` strays from its kind's published fields: ``Kind/name: path: message`` each."""
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    found = sorted(validator(str(obj.get("kind"))).iter_errors(obj), key=lambda e: list(map(str, e.path)))
    return [f"{name}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in found]


def all_errors(objects: list[dict[str, Any]], version: str) -> list[str]:
    """Every object checked: a kind of :data:`SCHEMAS` by :func:`errors`, any other with ``kubernetes-validate``
    (strict: an unknown field fails) at Kubernetes ``version``, as tests/deploy/test_manifests.py does."""
    found: list[str] = []
    for obj in objects:
        if obj["kind"] in SCHEMAS:
            found += errors(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            found.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    return found


def require_kubectl() -> None:
    """Skip the calling test where ``kubectl`` is not on PATH."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH: these tests render with `kubectl kustomize`")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Every object ``kubectl kustomize DIRECTORY`` renders; CalledProcessError (with kubectl's stderr) on failure."""
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True,
                         timeout=RENDER_TIMEOUT_SECONDS)
    return [o for o in yaml.safe_load_all(out.stdout) if o]
