"""The config file's JSON Schema (tools.configschema): current with the declarations, and true of real files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from tools import configschema
from tools.bench.config import full_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_schema_is_what_the_declarations_give() -> None:
    assert configschema.main(["--check"]) == 0, "docs/config.schema.json is stale: run python -m tools.configschema"


def test_the_schema_takes_the_shipped_and_the_full_config_and_refuses_an_unknown_key() -> None:
    schema = json.loads(configschema.OUT.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(tomllib.loads((ROOT / "deploy/kubernetes/base/ferry.toml").read_text(encoding="utf-8")))
    full = full_config()
    validator.validate(full)
    for section, key in (("proxy", "max_inflite"), ("controlplane", "tick"), ("scaling", "targetz")):
        with pytest.raises(jsonschema.ValidationError, match=key):
            validator.validate({**full, section: {**full[section], key: 1}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"proxy": {"max_inflight": "many"}})
