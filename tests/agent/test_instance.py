"""The JSON-instance maker (agent.replica.instance) against ``jsonschema``, on hand-written and pydantic schemas."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from typing import Annotated, Any, Literal

import jsonschema
import pydantic
import pytest
from openai.lib._pydantic import to_strict_json_schema

from agent.replica.instance import MAX_DEPTH, MAX_ITEMS, SchemaError, instance

pytestmark = pytest.mark.timeout(30)


def valid(schema: Any) -> Any:
    """The instance of ``schema``, checked by jsonschema (formats too), and JSON-serializable."""
    value = instance(schema)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
    assert json.loads(json.dumps(value)) == value
    return value


HAND_WRITTEN: dict[str, Any] = {
    "empty": {},
    "true": True,
    "object": {"type": "object"},
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "type-list": {"type": ["null", "integer"]},
    "nullable-anyof": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 3}]},
    "const": {"const": {"a": [1, 2]}},
    "enum-mixed": {"enum": [None, 3, "x"]},
    "required-and-optional": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                              "required": ["a"], "additionalProperties": False},
    "required-without-schema": {"type": "object", "required": ["x", "y"]},
    "max-properties": {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"},
                       "required": ["e"], "maxProperties": 2},
    "min-properties-extra": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 7},
                             "minProperties": 3},
    "dict-of-lists": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "boolean"}}},
    "array-bounds": {"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 5,
                     "uniqueItems": True},
    "array-max-zero": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
    "prefix-items-closed": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                            "items": False, "minItems": 2},
    "draft7-tuple": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                     "items": [{"type": "string"}, {"type": "null"}], "additionalItems": False},
    "enum-array-unique": {"type": "array", "items": {"enum": ["r", "g", "b"]}, "minItems": 3, "uniqueItems": True},
    "int-exclusive": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 12},
    "int-float-bounds": {"type": "integer", "minimum": 2.5, "maximum": 3.5},
    "int-negative": {"type": "integer", "maximum": -40},
    "number-open-unit": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "number-point": {"type": "number", "minimum": 2.25, "maximum": 2.25},
    "number-multiple-tenth": {"type": "number", "minimum": 0.25, "maximum": 2, "multipleOf": 0.1},
    "int-multiple": {"type": "integer", "minimum": 101, "multipleOf": 7},
    "int-multiple-half": {"type": "integer", "multipleOf": 0.5, "minimum": 3},
    "draft4-exclusive": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "minimum": 5,
                         "exclusiveMinimum": True, "maximum": 6},
    "string-long": {"type": "string", "minLength": 40},
    "string-short": {"type": "string", "maxLength": 3},
    "string-exact": {"type": "string", "minLength": 7, "maxLength": 7},
    "pattern-lower": {"type": "string", "pattern": "^[a-z]+$"},
    "pattern-digits": {"type": "string", "pattern": "^[0-9]+$"},
    "formats": {"type": "object", "properties": {f: {"type": "string", "format": f} for f in (
        "date-time", "date", "time", "duration", "email", "uri", "uuid", "ipv4", "ipv6", "hostname",
        "json-pointer", "regex")}, "required": ["date-time", "uuid"]},
    "all-of-merge": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}},
                                "required": ["a"]},
                               {"properties": {"a": {"maximum": 4}, "b": {"type": "string"}}, "required": ["b"]}]},
    "all-of-types": {"allOf": [{"type": ["string", "integer"]}, {"type": ["integer", "null"]}]},
    "ref-defs": {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
                 "type": "array", "items": {"$ref": "#/$defs/P"}, "minItems": 2},
    "ref-definitions": {"definitions": {"a/b": {"type": "string", "enum": ["slash"]}},
                        "properties": {"v": {"$ref": "#/definitions/a~1b"}}, "required": ["v"]},
    "ref-siblings": {"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "minLength": 30},
    "recursive-root": {"type": "object", "properties": {"name": {"type": "string"},
                                                         "children": {"type": "array", "items": {"$ref": "#"}}},
                       "required": ["name", "children"]},
    "recursive-optional": {"$defs": {"N": {"type": "object", "properties": {
        "next": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}}, "required": ["next"]}}, "$ref": "#/$defs/N"},
    "one-of-tagged": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]},
    "openapi-nullable": {"type": "object", "properties": {"n": {"type": "string", "nullable": True}},
                         "required": ["n"]},
    "default-used": {"type": "object", "properties": {"d": {"type": "integer", "default": 42}}},
    "default-wrong-type": {"type": "integer", "default": "seven"},
    "deep-nesting": {"type": "object", "required": ["a"], "properties": {"a": {
        "type": "object", "required": ["a"], "properties": {"a": {
            "type": "object", "required": ["a"], "properties": {"a": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}}}}}}}},
}


@pytest.mark.parametrize("schema", HAND_WRITTEN.values(), ids=HAND_WRITTEN.keys())
def test_a_hand_written_schema_gets_a_valid_instance(schema: Any) -> None:
    valid(schema)


def test_choices_are_the_informative_ones_where_there_is_room() -> None:
    assert valid(HAND_WRITTEN["type-list"]) == 1 and valid(HAND_WRITTEN["nullable-anyof"]) is not None
    assert valid(HAND_WRITTEN["default-used"]) == {"d": 42}
    assert valid(HAND_WRITTEN["enum-array-unique"]) == ["r", "g", "b"]
    assert valid({"type": "object"}) == {"answer": "the ferry"}
    assert set(valid(HAND_WRITTEN["required-and-optional"])) == {"a", "b"}
    assert valid(HAND_WRITTEN["int-exclusive"]) == 11 and valid(HAND_WRITTEN["int-multiple"]) == 105


def test_recursion_ends_in_minimal_values_below_the_soft_depth() -> None:
    chain = valid(HAND_WRITTEN["recursive-optional"])
    depth = 0
    while chain is not None:
        chain, depth = chain["next"], depth + 1
    assert depth == 2  # the recursion is made once, then ends at null
    tree = valid(HAND_WRITTEN["recursive-root"])
    assert tree["children"] and tree["children"][0]["name"]


def test_the_same_schema_always_gives_the_same_value() -> None:
    assert all(instance(s) == instance(s) for s in HAND_WRITTEN.values())


# -- schemas pydantic writes ---------------------------------------------------------------------------------------

class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(pydantic.BaseModel):
    street: str
    city: str = "Oslo"
    zip_code: Annotated[str, pydantic.StringConstraints(min_length=4, max_length=5)]


class Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    lives: Annotated[int, pydantic.Field(ge=1, le=9)]


class Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Person(pydantic.BaseModel):
    name: str
    age: Annotated[int, pydantic.Field(gt=0, lt=130)]
    height: Annotated[float, pydantic.Field(gt=0.5, le=2.5, multiple_of=0.01)]
    color: Color
    mood: Literal["calm", "busy"]
    home: Address
    former: list[Address] = []
    second: Address | None = None
    tags: set[str] = pydantic.Field(min_length=2)
    scores: dict[str, int]
    pair: tuple[int, str]
    born: datetime.date
    seen: datetime.datetime
    ident: uuid.UUID
    pet: Annotated[Cat | Dog, pydantic.Field(discriminator="kind")]
    pets: list[Cat | Dog] = pydantic.Field(min_length=3)
    nickname: str | None = None


class Tree(pydantic.BaseModel):
    label: str
    children: list[Tree]
    parent: Tree | None = None


class Weather(pydantic.BaseModel):
    city: str
    degrees: float
    sunny: bool
    hours: list[int]


MODELS = (Address, Cat, Person, Tree, Weather)


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
@pytest.mark.parametrize("strict", [False, True], ids=["pydantic", "openai-strict"])
def test_a_pydantic_schema_gets_an_instance_the_model_validates(model: type[pydantic.BaseModel], strict: bool) -> None:
    schema = to_strict_json_schema(model) if strict else model.model_json_schema()
    value = valid(schema)
    model.model_validate_json(json.dumps(value))  # pydantic accepts it too (formats, discriminators, tuples)


# -- refused, naming where ------------------------------------------------------------------------------------------

REFUSED: dict[str, tuple[Any, str, str]] = {
    "false": (False, "$", "admits no value"),
    "false-property": ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "$.a", "admits no value"),
    "empty-enum": ({"enum": []}, "$", "enum"),
    "not-a-schema": ({"type": "object", "properties": {"a": 3}, "required": ["a"]}, "$.a", "object or a boolean"),
    "bad-type": ({"type": 5}, "$", "type"),
    "unknown-type": ({"type": "tensor"}, "$", "unknown type"),
    "too-many-items": ({"type": "array", "minItems": MAX_ITEMS + 1}, "$", "minItems"),
    "items-closed": ({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2}, "$", "minItems"),
    "no-room": ({"type": "object", "additionalProperties": False, "minProperties": 1}, "$", "minProperties"),
    "long-string": ({"type": "string", "minLength": 10**6}, "$", "minLength"),
    "crossed-lengths": ({"type": "string", "minLength": 5, "maxLength": 2}, "$", "maxLength"),
    "crossed-bounds": ({"type": "integer", "minimum": 5, "maximum": 4}, "$", "no integer"),
    "no-multiple": ({"type": "integer", "minimum": 1, "maximum": 6, "multipleOf": 7}, "$", "no integer"),
    "infinite-bound": ({"type": "number", "minimum": float("inf")}, "$", "finite"),
    "self-ref": ({"$ref": "#"}, "$", "deeper"),
    "remote-ref": ({"$ref": "https://example.com/s.json"}, "$", "local"),
    "anchor-ref": ({"$ref": "#thing"}, "$", "local"),
    "dangling-ref": ({"$ref": "#/$defs/missing"}, "$", "points nowhere"),
    "required-recursion": ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                           "$" + ".a" * (MAX_DEPTH // 2), "deeper"),
}


@pytest.mark.parametrize(("schema", "path", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_a_schema_without_an_instance_is_refused_naming_where(schema: Any, path: str, reason: str) -> None:
    with pytest.raises(SchemaError) as refused:
        instance(schema)
    assert refused.value.path.startswith(path) and reason in refused.value.reason


def test_an_exploding_schema_is_refused_within_its_bounds() -> None:
    defs: dict[str, Any] = {"L0": {"type": "integer"}}
    for level in range(1, 21):  # each level twice the one below: 2^20 steps unbounded
        defs[f"L{level}"] = {"allOf": [{"$ref": f"#/$defs/L{level - 1}"}, {"$ref": f"#/$defs/L{level - 1}"}]}
    with pytest.raises(SchemaError, match="steps"):
        instance({"$defs": defs, "$ref": "#/$defs/L20"})
    wide = {"type": "object", "required": [f"p{i}" for i in range(60)],
            "properties": {f"p{i}": {"type": "array", "minItems": 200, "items": {"type": "integer"}}
                           for i in range(60)}}
    with pytest.raises(SchemaError, match="values"):
        instance(wide)
