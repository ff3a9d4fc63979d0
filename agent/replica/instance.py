"""A JSON value that matches a JSON Schema: the simulated model's structured output and tool-call arguments.

Pure and deterministic: :func:`instance` walks the schema once from its root
and builds a value (the same schema always gives the same value), for the
schemas pydantic v2 and OpenAI's structured outputs write. At each node, in
this order:

- ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``, any local JSON
  pointer) is resolved against the root and merged with its siblings;
  ``allOf`` is merged into one schema (``properties`` and ``required``
  united, a property in several parts takes all of them, ``type`` lists
  intersected, other keywords from the last part that has them);
- ``const``; ``enum`` (value ``i mod n`` for the i-th item of an array, so
  the items differ); ``default`` when its JSON type fits ``type``;
- ``anyOf`` / ``oneOf``: the first branch that is not ``null`` (``oneOf``
  is honoured when its branches exclude each other, as the ``const``
  discriminators of pydantic's tagged unions do);
- ``type`` (a list: its first type but ``null``; none: inferred from the
  keywords, ``properties`` an object, ``items`` an array, ``minimum`` a
  number, else a string): an object gets its ``properties`` in order (the
  required ones always, the others while ``maxProperties`` allows), the
  names of ``required`` without a property schema, enough extra keys for
  ``minProperties``, and one entry ``answer`` when it defines no properties
  and ``additionalProperties`` is not false (``{"type": "object"}``, a
  ``dict[str, X]``); an array its ``prefixItems`` (or a list ``items``) then
  ``items`` up to ``max(minItems, 1)``, at most ``maxItems``; a string the
  example of its ``format`` (date-time, date, time, duration, email, uri,
  uuid, ipv4, ipv6, hostname ...) or words of the replica's vocabulary
  stretched to ``minLength`` and cut to ``maxLength`` (a ``pattern`` is
  tried on a few candidates, and not solved beyond them); an integer
  ``1 + i``, a number ``1.5 + i``, moved inside ``minimum`` / ``maximum``
  (exclusive ones too, draft 4's boolean form included) and onto a
  ``multipleOf`` (checked with the float division validators use; else 0 if
  it is in range); ``true``; ``null``.

Minimal mode, inside a ``$ref`` that is already being made (a recursive
model: a tree of nodes), below :data:`SOFT_DEPTH` levels or past
:data:`SOFT_VALUES` values: only required properties, ``minItems`` items, the cheapest branch of
``anyOf`` / ``oneOf`` (``null``, then a scalar) and ``null`` from a nullable
type, so recursion ends at once where the schema lets it. Bounds: a schema that
still nests past :data:`MAX_DEPTH` levels (``$ref`` hops count), needs more
than :data:`MAX_VALUES` values, more than :data:`MAX_ITEMS` items or
properties, or a string over :data:`MAX_STRING` characters, or has no
instance (``false``, an empty ``enum``, bounds that exclude every value) is
refused with :class:`SchemaError` naming the place in the value
(``$.hours[0]``). Not honoured: ``not``, ``if`` / ``then`` / ``else``,
``dependentRequired`` / ``dependentSchemas``, ``contains``,
``patternProperties`` and ``propertyNames`` (extra keys are not checked
against them), ``uniqueItems`` beyond the per-index variation.

Cost: O(size of the value x the ``$ref`` hops per node), both bounded.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from agent.replica.tensors import VOCABULARY

SOFT_DEPTH = 8  # deeper than this, values are minimal
SOFT_VALUES = 256  # past this many values, too
MAX_DEPTH = 48
MAX_VALUES = 4096
MAX_ITEMS = 256  # items of one array, properties of one object
MAX_STRING = 4096
MAX_HOPS = 16384  # $ref and allOf steps of one walk (a schema of allOf over allOf could otherwise explode)
FORMATS = {
    "date-time": "2025-01-01T12:00:00Z", "date": "2025-01-01", "time": "12:00:00Z", "duration": "P1D",
    "email": "ferry@example.com", "idn-email": "ferry@example.com", "uri": "https://example.com/ferry",
    "iri": "https://example.com/ferry", "uri-reference": "/ferry", "iri-reference": "/ferry",
    "uri-template": "https://example.com/{ferry}", "url": "https://example.com/ferry",
    "uuid": "00000000-0000-4000-8000-000000000000", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1",
    "hostname": "example.com", "idn-hostname": "example.com", "json-pointer": "/ferry",
    "relative-json-pointer": "0/ferry", "regex": "ferry", "binary": "ferry", "byte": "ZmVycnk=",
}
_SCALARS = ("string", "integer", "number", "boolean")
_JSON_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
    "boolean": (bool,), "null": (type(None),)}


class SchemaError(ValueError):
    """A schema with no instance this maker can build; ``path`` is where in the value (``$``: the root)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def instance(schema: object) -> Any:
    """A JSON value valid against ``schema`` (a dict or a boolean); raises SchemaError (see the module docstring)."""
    return _Maker(schema).make(schema, "$", 0, 0)


class _Maker:
    """One walk: the root (for ``$ref``) and the count of values made (the bound)."""

    def __init__(self, root: object) -> None:
        self.root, self.values, self.hops = root, 0, 0
        self.open: list[str] = []  # the $refs being made, outermost first

    def make(self, schema: object, path: str, depth: int, index: int, minimal: bool = False) -> Any:
        """The value of ``schema`` at ``path``: the ``index``-th item of its array (0 elsewhere); ``minimal``
        when its parent's is."""
        if depth > MAX_DEPTH:
            raise SchemaError(path, f"nests deeper than {MAX_DEPTH} levels (a required recursion?)")
        self.values += 1
        if self.values > MAX_VALUES:
            raise SchemaError(path, f"needs more than {MAX_VALUES} values")
        refs: list[str] = []
        node = self._resolved(schema, path, depth, refs)
        minimal = minimal or depth > SOFT_DEPTH or self.values > SOFT_VALUES or any(r in self.open for r in refs)
        self.open += refs
        try:
            return self._value(node, path, depth, index, minimal)
        finally:
            del self.open[len(self.open) - len(refs):]

    def _value(self, node: Mapping[str, Any], path: str, depth: int, index: int, minimal: bool) -> Any:
        if "const" in node:
            return copy.deepcopy(node["const"])
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(path, "enum must be a non-empty list")
            return copy.deepcopy(values[index % len(values)])
        if node.get("default") is not None and _fits(node["default"], node.get("type")):
            return copy.deepcopy(node["default"])
        for key in ("anyOf", "oneOf"):
            if key in node:
                return self.make(self._branch(node, key, path, minimal), path, depth + 1, index, minimal)
        kind = _kind(node, minimal, path)
        if kind == "null":
            return None
        if kind == "boolean":
            return True
        if kind in ("integer", "number"):
            return _number(node, kind, index, path)
        if kind == "string":
            return _string(node, index, path)
        if kind == "array":
            return self._array(node, path, depth, minimal)
        if kind == "object":
            return self._object(node, path, depth, minimal)
        raise SchemaError(path, f"unknown type {kind!r}")

    def _resolved(self, schema: object, path: str, depth: int, refs: list[str] | None = None) -> dict[str, Any]:
        """``schema`` as one dict: booleans read, ``$ref`` followed (appended to ``refs``) and ``allOf`` merged
        (each hop a level)."""
        for _ in range(MAX_DEPTH - depth + 1):
            self.hops += 1
            if self.hops > MAX_HOPS:
                raise SchemaError(path, f"takes more than {MAX_HOPS} $ref and allOf steps")
            if schema is True:
                return {}
            if schema is False:
                raise SchemaError(path, "the schema false admits no value")
            if not isinstance(schema, dict):
                raise SchemaError(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
            if "$ref" in schema:
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                target = self._pointer(schema["$ref"], path)
                if refs is not None:
                    refs.append(schema["$ref"])
                schema = _merge([self._resolved(target, path, depth + 1, refs), rest]) if rest else target
            elif "allOf" in schema:
                parts = schema["allOf"]
                if not isinstance(parts, list):
                    raise SchemaError(path, "allOf must be a list of schemas")
                rest = {k: v for k, v in schema.items() if k != "allOf"}
                schema = _merge([rest, *(self._resolved(p, path, depth + 1, refs) for p in parts)])
            else:
                return schema
            depth += 1
        raise SchemaError(path, f"$ref and allOf nest deeper than {MAX_DEPTH} levels")

    def _pointer(self, ref: object, path: str) -> object:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise SchemaError(path, f"only local JSON pointers are resolved as $ref, got {str(ref)[:80]!r}")
        node = self.root
        for raw in ref[2:].split("/") if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(path, f"$ref {ref[:80]!r} points nowhere")
        return node

    def _branch(self, node: Mapping[str, Any], key: str, path: str, minimal: bool) -> object:
        branches = node[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(path, f"{key} must be a non-empty list")
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
        if minimal:
            chosen = min(branches, key=lambda b: _cost(self._resolved(b, path, 0)))
        else:
            chosen = next((b for b in branches if _cost(self._resolved(b, path, 0)) != 0), branches[0])
        return {"allOf": [rest, chosen]} if rest else chosen  # the branch's $refs still seen by make

    def _array(self, node: Mapping[str, Any], path: str, depth: int, minimal: bool) -> list[Any]:
        items = node.get("items", True)
        prefix = node.get("prefixItems", items if isinstance(items, list) else [])
        rest = node.get("additionalItems", True) if isinstance(items, list) else items
        low, high = _size(node, "minItems", 0, path), _size(node, "maxItems", MAX_ITEMS, path)
        if not isinstance(prefix, list):
            raise SchemaError(path, "prefixItems must be a list of schemas")
        count = max(low, min(len(prefix), low) if minimal else max(len(prefix), 1))
        count = min(count, high, len(prefix) if rest is False else MAX_ITEMS)
        if count < low:
            raise SchemaError(path, f"minItems {low} is more than the items allowed")
        return [self.make(prefix[i] if i < len(prefix) else rest, f"{path}[{i}]", depth + 1, i, minimal)
                for i in range(count)]

    def _object(self, node: Mapping[str, Any], path: str, depth: int, minimal: bool) -> dict[str, Any]:
        properties = node.get("properties", {})
        required = node.get("required", [])
        extra = node.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(path, "properties must be an object and required a list")
        low, high = _size(node, "minProperties", 0, path), _size(node, "maxProperties", MAX_ITEMS, path)
        names = [n for n in properties if n in required]
        names += [n for n in properties if n not in required][:0 if minimal else max(high - len(names), 0)]
        names += [n for n in dict.fromkeys(required) if isinstance(n, str) and n not in properties]
        if len(names) > MAX_ITEMS:
            raise SchemaError(path, f"more than {MAX_ITEMS} properties")
        wanted = max(low, 0 if minimal or properties or extra is False else min(1, high))
        if len(names) < wanted:
            names += [n for n in properties if n not in names][:wanted - len(names)]
        keys = ("answer", *(f"key{i}" for i in range(1, MAX_ITEMS)))
        for key in keys[:max(wanted - len(names), 0)]:
            if extra is False:
                raise SchemaError(path, f"minProperties {low} is more than the properties allowed")
            names.append(key)
        default = True if extra is False else extra  # a required name without a property schema
        return {name: self.make(properties.get(name, default), f"{path}.{name}", depth + 1, 0, minimal)
                for name in names}


def _merge(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One schema that asks for what every one of ``parts`` asks (see the module docstring)."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key == "properties" and isinstance(value, dict) and isinstance(out.get(key), dict):
                merged = dict(out[key])
                for name, sub in value.items():
                    merged[name] = {"allOf": [merged[name], sub]} if name in merged else sub
                out[key] = merged
            elif key == "required" and isinstance(value, list) and isinstance(out.get(key), list):
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "type" and key in out:
                mine, theirs = _types(out[key]), _types(value)
                both = [t for t in mine if t in theirs or (t == "integer" and "number" in theirs)]
                both += [t for t in theirs if t == "integer" and "number" in mine and t not in both]
                out[key] = both if len(both) != 1 else both[0]
            else:
                out[key] = value
    return out


def _types(value: object) -> list[str]:
    return [value] if isinstance(value, str) else [t for t in value if isinstance(t, str)] \
        if isinstance(value, list) else []


def _kind(node: Mapping[str, Any], minimal: bool, path: str = "$") -> str:
    """The JSON type to make for ``node`` (see the module docstring)."""
    if "type" in node:
        types = _types(node["type"])
        if not types:
            raise SchemaError(path, f"type must be a name or a list of names, got {node['type']!r}"[:120])
        if minimal and "null" in types:
            return "null"
        return next((t for t in types if t != "null"), "null")
    if minimal and node.get("nullable") is True:
        return "null"
    if {"properties", "required", "additionalProperties", "minProperties", "maxProperties"} & node.keys():
        return "object"
    if {"items", "prefixItems", "minItems", "maxItems"} & node.keys():
        return "array"
    if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} & node.keys():
        return "number"
    return "string"


def _cost(node: Mapping[str, Any]) -> int:
    """How small a branch's value is: null 0, a scalar 1, the rest 2 (minimal mode takes the least)."""
    if "const" in node or "enum" in node:
        return 1
    kind = _kind(node, True) if {"type", "nullable"} & node.keys() else "any"
    return 0 if kind == "null" else 1 if kind in _SCALARS else 2


def _fits(value: object, declared: object) -> bool:
    """Whether ``value``'s JSON type is one of ``declared`` (no type declared: any)."""
    if declared is None:
        return True
    for name in _types(declared):
        kinds = _JSON_TYPES.get(name, ())
        if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
            return True
    return False


def _size(node: Mapping[str, Any], key: str, default: int, path: str, bound: int = MAX_ITEMS) -> int:
    """A size keyword (``minItems`` ...): a non-negative integer, a minimum at most ``bound``."""
    value = node.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(path, f"{key} must be a non-negative integer, got {value!r}"[:120])
    if key.startswith("min") and value > bound:
        raise SchemaError(path, f"{key} {value} over the bound of {bound}")
    return value


def _bound(node: Mapping[str, Any], key: str, path: str) -> tuple[float | None, bool]:
    """A lower (``minimum``) or upper (``maximum``) bound and whether it is exclusive."""
    exclusive = "exclusiveM" + key[1:]
    value, strict = node.get(key), False
    if isinstance(node.get(exclusive), bool):  # draft 4: a flag on minimum / maximum
        strict = node[exclusive]
    elif exclusive in node:
        other = node[exclusive]
        if value is None or (isinstance(other, (int, float)) and (other >= value if key == "minimum"
                                                                   else other <= value)):
            value, strict = other, True
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or not math.isfinite(value)):
        raise SchemaError(path, f"{key} must be a finite number, got {value!r}"[:120])
    return value, strict


def _multiple(value: float, step: float) -> bool:
    """Whether ``value`` is a multiple of ``step`` as validators check it (exact for integers, else by division)."""
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    quotient = value / step
    return math.isfinite(quotient) and int(quotient) == quotient


def _number(node: Mapping[str, Any], kind: str, index: int, path: str) -> int | float:
    low, low_strict = _bound(node, "minimum", path)
    high, high_strict = _bound(node, "maximum", path)
    integer = kind == "integer"
    if integer:  # integer bounds, inclusive
        low = None if low is None else (math.floor(low) + 1 if low_strict else math.ceil(low))
        high = None if high is None else (math.ceil(high) - 1 if high_strict else math.floor(high))
        low_strict = high_strict = False

    def inside(v: float) -> bool:
        above = low is None or (v > low if low_strict else v >= low)
        return above and (high is None or (v < high if high_strict else v <= high))

    value: int | float = (1 + index) if integer else (1.5 + index)
    if not inside(value):
        if low is not None and high is not None:
            value = (low + high) // 2 if integer else (low + high) / 2
        else:
            value = low + 1 if low is not None else high - 1 if high is not None else value
    step = node.get("multipleOf")
    if step is not None:
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not 0 < step < math.inf:
            raise SchemaError(path, f"multipleOf must be a positive number, got {step!r}"[:120])
        exact = Fraction(str(step))
        start = math.ceil(Fraction(str(low)) / exact) if low is not None else math.ceil(Fraction(str(value)) / exact)
        candidates = (Fraction(k) * exact for k in range(start, start + 64))
        fits = (c for c in candidates if (not integer or c.denominator == 1) and inside(float(c)))
        found = [v for v in (int(c) if c.denominator == 1 else float(c) for c in fits) if _multiple(v, step)][:1]
        value = found[0] if found else 0
    if not inside(value) or (step is not None and not _multiple(value, step)):
        raise SchemaError(path, f"no {kind} within the bounds of {dict(node)!r}"[:200])
    return int(value) if integer else value


def _string(node: Mapping[str, Any], index: int, path: str) -> str:
    low, high = _size(node, "minLength", 0, path, MAX_STRING), _size(node, "maxLength", MAX_STRING, path)
    if low > high:
        raise SchemaError(path, f"minLength {low} is over maxLength {high}")
    fmt = node.get("format")
    words = " ".join(VOCABULARY[(index + i) % len(VOCABULARY)] for i in range(2))
    base = FORMATS.get(fmt, words) if isinstance(fmt, str) else words
    candidates = [base, words, "ferry", "a", "A", "0", "1", "ab", "a1", "ferry-1", "FERRY", "x" * max(low, 1)]
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise SchemaError(path, f"pattern is not a regular expression: {exc}") from None
        candidates = [c for c in candidates if compiled.search(c)] + [base]
    text = candidates[0]
    while len(text) < low:
        text += " " + VOCABULARY[len(text) % len(VOCABULARY)]
    return text[:high]
