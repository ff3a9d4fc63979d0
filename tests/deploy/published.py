"""The custom resources' fields as their projects publish them, and ``kubectl kustomize`` to render.

:data:`SCHEMAS` maps each custom kind these tests check to a JSON Schema in
``schemas/``, written from the published CRD's ``openAPIV3Schema`` (each file's
header names the repository, tag, commit and path it was read from).
:func:`errors` validates one object with ``jsonschema`` (draft 2020-12) and
returns its errors, each naming the kind, the object and the field's path;
:func:`all_errors` checks a whole render, the core kinds with
``kubernetes-validate``.
Rendering is :func:`tests.deploy.kube.render` (the real ``kubectl kustomize``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
SCHEMAS = {
    "InferencePool": "inferencepool.yaml",
    "HTTPRoute": "httproute.yaml",
    "Gateway": "gateway.yaml",
    "ServiceMonitor": "servicemonitor.yaml",
    "PodMonitor": "podmonitor.yaml",
    "PrometheusRule": "prometheusrule.yaml",
    "ScaledObject": "keda-scaledobject.yaml",
}


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
