"""A small Kustomize renderer in pure Python, for the manifests under ``deploy/kubernetes/`` (no kubectl needed).

It renders the features those kustomizations use, as ``kustomize build``
does, and refuses any other key (:class:`KustomizeError`), so a new
feature is either added here or fails the deploy tests at once:

- ``resources``: YAML files (several documents each) and directories
  (kustomizations of their own, rendered first);
- ``namespace``: set on every namespaced object;
- ``configMapGenerator`` and ``secretGenerator`` (``files``, ``literals``,
  ``envs``; ``options.labels``, ``options.disableNameSuffixHash``): the
  name carries Kustomize's content hash (:func:`content_hash`), and every
  reference to the generator's name in a pod spec of the same build follows;
- ``nameSuffix``: appended to every object of the kustomization, and to the
  references that name them (a HorizontalPodAutoscaler's target);
- ``labels`` (``pairs``, ``includeSelectors``, ``includeTemplates``): with
  selectors, as ``commonLabels`` (Services, workloads with their spread and
  affinity terms' label maps, PodDisruptionBudgets, NetworkPolicies' own pods);
- ``patches``: JSON 6902 operations (``add``, ``replace``, ``remove``), inline
  or from a file, on the objects a ``target`` (``kind``, ``name`` as an
  anchored regular expression) selects.

``python -m tools.kustomize DIR`` prints the rendered objects as YAML, one
document each. The deploy tests compare this renderer with ``kubectl
kustomize`` whenever kubectl is on PATH.
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

Obj = dict[str, Any]

KNOWN_KEYS = {"apiVersion", "kind", "resources", "namespace", "configMapGenerator", "secretGenerator",
              "generatorOptions", "nameSuffix", "labels", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ClusterIssuer",
                  "PersistentVolume", "StorageClass", "PriorityClass"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render: an unknown key, a missing file, a bad patch."""


def content_hash(obj: Obj) -> str:
    """Kustomize's name suffix of a generated ConfigMap or Secret: 10 characters of a sha256 of its content.

    The content is the JSON (keys sorted, HTML characters escaped as Go's encoder does) of the kind, the
    data (and the type, for a Secret) and an empty name (Kustomize 5 hashes the generated object before it
    names it); the hex digits are mapped so that no vowel or digit
    pattern spells a word (0→g, 1→h, 3→k, a→m, e→t)."""
    fields: Obj = {"kind": obj["kind"], "name": "", "data": obj.get("data", {})}
    if obj["kind"] == "Secret":
        fields["type"] = obj.get("type", "")
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def load_documents(path: Path) -> list[Obj]:
    """The non-empty YAML documents of a file."""
    try:
        return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    except OSError as exc:
        raise KustomizeError(f"{path}: {exc.strerror}") from exc


def render(directory: str | Path) -> list[Obj]:
    """The objects that ``kustomize build DIRECTORY`` gives (order aside)."""
    return _build(Path(directory).resolve())[0]


def _build(root: Path) -> tuple[list[Obj], dict[tuple[str, str], str]]:
    """The objects of one kustomization, and the generated names (with their hash) by (kind, name) for the
    references of the kustomizations above it."""
    file = root / "kustomization.yaml"
    if not file.is_file():
        raise KustomizeError(f"{root}: no kustomization.yaml")
    spec = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{file}: keys this renderer does not handle: {sorted(unknown)}")
    objects: list[Obj] = []
    generated: dict[tuple[str, str], str] = {}
    for entry in spec.get("resources", []):
        path = root / entry
        if path.is_dir():
            below, names = _build(path.resolve())
            objects += below
            generated.update(names)
        else:
            objects += load_documents(path)
    options = spec.get("generatorOptions", {})
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(key, []):
            made, hashed = _generate(root, kind, generator, options)
            objects.append(made)
            if hashed != generator["name"]:
                generated[(kind, generator["name"])] = hashed
    renamed = dict(generated)
    suffix = spec.get("nameSuffix", "")
    if suffix:
        for obj in objects:
            if obj["kind"] not in ("ConfigMap", "Secret"):
                renamed[(obj["kind"], obj["metadata"]["name"])] = obj["metadata"]["name"] + suffix
            obj["metadata"]["name"] += suffix
    for obj in objects:
        _rename_references(obj, renamed)
    for entry in spec.get("labels", []):
        for obj in objects:
            _add_labels(obj, entry)
    for patch in spec.get("patches", []):
        _apply_patch(root, objects, patch)
    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    return objects, generated


def _generate(root: Path, kind: str, generator: Obj, defaults: Obj) -> tuple[Obj, str]:
    """A generated ConfigMap or Secret, and its name with the content hash (unless disabled)."""
    unknown = set(generator) - {"name", "files", "literals", "envs", "options"}
    if unknown:
        raise KustomizeError(f"{kind} generator {generator.get('name')}: keys not handled: {sorted(unknown)}")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        source = root / path
        data[key or source.name] = _read(source)
    for entry in generator.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    for entry in generator.get("envs", []):
        for line in _read(root / entry).splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    options = {**defaults, **generator.get("options", {})}
    obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
    if options.get("labels"):
        obj["metadata"]["labels"] = dict(options["labels"])
    if kind == "Secret":
        obj["type"] = "Opaque"
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    name = generator["name"]
    if not options.get("disableNameSuffixHash"):
        name = f"{name}-{content_hash(obj)}"
        obj["metadata"]["name"] = name
    return obj, name


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KustomizeError(f"{path}: {exc.strerror}") from exc


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec of a workload (its template's), or None for another kind."""
    if obj["kind"] in WORKLOADS:
        spec: Obj = obj["spec"]["template"]["spec"]
        return spec
    return None


def _rename_references(obj: Obj, renamed: dict[tuple[str, str], str]) -> None:
    def new(kind: str, name: str) -> str:
        return renamed.get((kind, name), name)

    if obj["kind"] == "HorizontalPodAutoscaler":
        target = obj["spec"]["scaleTargetRef"]
        target["name"] = new(target["kind"], target["name"])
    spec = pod_spec(obj)
    if spec is None:
        return
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = new("ConfigMap", volume["configMap"]["name"])
        if "secret" in volume:
            volume["secret"]["secretName"] = new("Secret", volume["secret"]["secretName"])
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if key in source:
                    source[key]["name"] = new(kind, source[key]["name"])
        for env_from in container.get("envFrom", []):
            for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                if key in env_from:
                    env_from[key]["name"] = new(kind, env_from[key]["name"])


def _selectors(obj: Obj) -> Iterator[Obj]:
    """The label maps that ``commonLabels`` extends in ``obj`` beside its own labels, created when absent."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind == "Service" and spec.get("type") != "ExternalName":
        yield spec.setdefault("selector", {})
    elif kind in WORKLOADS or kind == "PodDisruptionBudget":
        yield spec.setdefault("selector", {}).setdefault("matchLabels", {})
        pod = pod_spec(obj) or {}
        terms = [c.get("labelSelector", {}) for c in pod.get("topologySpreadConstraints", [])]
        for affinity in ("podAffinity", "podAntiAffinity"):
            rules = pod.get("affinity", {}).get(affinity, {})
            required = rules.get("requiredDuringSchedulingIgnoredDuringExecution", [])
            terms += [t.get("labelSelector", {}) for t in required]
            terms += [t.get("podAffinityTerm", {}).get("labelSelector", {})
                      for t in rules.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
        yield from (term["matchLabels"] for term in terms if "matchLabels" in term)
    elif kind == "NetworkPolicy":
        yield spec.setdefault("podSelector", {}).setdefault("matchLabels", {})


def _add_labels(obj: Obj, entry: Obj) -> None:
    unknown = set(entry) - {"pairs", "includeSelectors", "includeTemplates"}
    if unknown:
        raise KustomizeError(f"labels: keys not handled: {sorted(unknown)}")
    pairs = {str(k): str(v) for k, v in entry["pairs"].items()}
    obj["metadata"].setdefault("labels", {}).update(pairs)
    selectors = entry.get("includeSelectors", False)
    if (selectors or entry.get("includeTemplates", False)) and obj["kind"] in WORKLOADS:
        obj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    if selectors:
        for selector in _selectors(obj):
            selector.update(pairs)


def _apply_patch(root: Path, objects: list[Obj], patch: Obj) -> None:
    unknown = set(patch) - {"target", "patch", "path"}
    if unknown:
        raise KustomizeError(f"patches: keys not handled: {sorted(unknown)}")
    operations = yaml.safe_load(patch["patch"] if "patch" in patch else _read(root / patch["path"]))
    if not isinstance(operations, list):
        raise KustomizeError("patches: only JSON 6902 patches (a list of operations) are handled")
    target = patch.get("target", {})
    if set(target) - {"kind", "name"}:
        raise KustomizeError(f"patches: target keys not handled: {sorted(set(target) - {'kind', 'name'})}")
    matched = [obj for obj in objects
               if obj["kind"] == target.get("kind", obj["kind"])
               and re.fullmatch(target.get("name", ".*"), obj["metadata"]["name"])]
    if not matched:
        raise KustomizeError(f"patches: no object matches the target {target}")
    for obj in matched:
        for operation in operations:
            json_patch(obj, operation)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"patch path {path!r}: must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(obj: Obj, operation: Obj) -> None:
    """Apply one JSON 6902 operation (``add``, ``replace`` or ``remove``) to ``obj`` in place."""
    op, parts = operation.get("op"), _pointer(operation.get("path", ""))
    parent: Any = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    value = copy.deepcopy(operation.get("value"))
    actions: dict[str, Callable[[], None]]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        actions = {"add": lambda: parent.insert(index, value),
                   "replace": lambda: parent.__setitem__(index, value),
                   "remove": lambda: parent.pop(index)}
    else:
        if op in ("replace", "remove") and last not in parent:
            raise KustomizeError(f"patch {op} {operation['path']}: no such field")
        actions = {"add": lambda: parent.__setitem__(last, value),
                   "replace": lambda: parent.__setitem__(last, value),
                   "remove": lambda: parent.pop(last)}
    if op not in actions:
        raise KustomizeError(f"patch operation {op!r}: only add, replace and remove are handled")
    try:
        actions[op]()
    except (IndexError, KeyError) as exc:
        raise KustomizeError(f"patch {op} {operation['path']}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """Print the objects a kustomization directory renders to, as YAML documents."""
    parser = argparse.ArgumentParser(prog="python -m tools.kustomize", description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="a directory with a kustomization.yaml")
    args = parser.parse_args(argv)
    try:
        objects = render(args.directory)
    except KustomizeError as exc:
        print(f"tools.kustomize: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
