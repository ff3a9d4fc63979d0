"""The config file's JSON Schema, drawn from the declarations the planes validate it with.

Each section of the file is a frozen dataclass (:mod:`ferry.config` lists them); pydantic
validates a section against its dataclass (:func:`ferry.config.from_mapping`, config
:data:`ferry.config.CONFIG`) and, from the same declarations, writes its JSON Schema here: the
field types, the defaults, ``additionalProperties: false``, each class's docstring as the
description of its object, and each field's trailing ``#`` comment in its declaration as the
description of its key. The ``[proxy]`` section is flat: its keys are the fields of the parts of
:class:`dataplane.config.ProxySettings`, one object. Ranges are checked by each class's
``__post_init__`` and are not in the schema.

``python -m tools.configschema`` writes ``docs/config.schema.json``; ``--check`` exits 1 when the
committed file is not what the declarations give (``tests/test_configschema.py`` runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

import pydantic

from agent.config import AgentSettings
from agent.replica.engine import EngineParams
from controlplane.config import ControlPlaneSettings
from controlplane.services.scaling import ScalingSettings
from dataplane.config import IDENTITY, ProxySettings
from dataplane.envoy.bootstrap import EnvoySettings
from ferry.config import CONFIG, MAX_GUARDRAILS, SECTIONS, GuardrailConfig, Limits, ModelConfig, TenantConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.schema.json"
PLANE_SECTIONS: dict[str, type[Any]] = {"controlplane": ControlPlaneSettings, "scaling": ScalingSettings,
                                        "agent": AgentSettings, "replica": EngineParams, "envoy": EnvoySettings}


def comments(cls: type[Any]) -> dict[str, str]:
    """Each field of dataclass ``cls`` -> the ``#`` comment of its declaration: on its line, else the lines above."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    fields: dict[int, str] = {}  # line -> the field declared on it
    trailing: dict[int, str] = {}  # line -> its comment after code
    above: dict[int, list[str]] = {}  # line -> the comment lines just above it
    block: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        row, text = token.start[0], token.line.strip()
        if token.type == tokenize.COMMENT:
            if text.startswith("#"):
                block.append(token.string.lstrip("#").strip())
            else:
                trailing[row] = token.string.lstrip("#").strip()
        elif token.type == tokenize.NAME and token.string in names and text.startswith(token.string + ":"):
            fields[row] = token.string
            above[row], block = block, []
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT):
            block = [] if row not in fields else block
    return {name: trailing.get(row) or " ".join(above.get(row, [])) for row, name in fields.items()
            if trailing.get(row) or above.get(row)}


def _field(f: dataclasses.Field[Any], hint: Any) -> tuple[str, Any, Any]:
    default = (dataclasses.field(default_factory=f.default_factory) if f.default is dataclasses.MISSING
               else dataclasses.field(default=f.default))
    return f.name, hint, default


def proxy_section() -> type[Any]:
    """The flat ``[proxy]`` section as one dataclass: the identity keys and every part's fields."""
    hints = typing.get_type_hints(ProxySettings)
    fields = []
    for f in dataclasses.fields(ProxySettings):
        if f.name in IDENTITY:
            fields.append(_field(f, hints[f.name]))
            continue
        part = hints[f.name]
        part_hints = typing.get_type_hints(part)
        fields += [_field(g, part_hints[g.name]) for g in dataclasses.fields(part)]
    section = dataclasses.make_dataclass("ProxySection", fields, frozen=True, kw_only=True)
    section.__doc__ = inspect.getdoc(ProxySettings)
    return section


def _parts() -> list[type[Any]]:
    hints = typing.get_type_hints(ProxySettings)
    return [hints[f.name] for f in dataclasses.fields(ProxySettings) if f.name not in IDENTITY]


def schema() -> dict[str, Any]:
    """The JSON Schema of a whole config file (every section optional)."""
    proxy = proxy_section()
    fields = [
        ("tenants", tuple[TenantConfig, ...], dataclasses.field(default=())),
        ("models", tuple[ModelConfig, ...], dataclasses.field(default=())),
        ("guardrails", tuple[GuardrailConfig, ...], dataclasses.field(default=())),
        ("limits", Limits, dataclasses.field(default_factory=Limits)),
        ("proxy", proxy, dataclasses.field(default_factory=proxy)),
        *[(name, cls, dataclasses.field(default_factory=cls)) for name, cls in PLANE_SECTIONS.items()],
    ]
    assert [name for name, *_ in fields] == list(SECTIONS), "every section of ferry.config.SECTIONS, in order"
    file = dataclasses.make_dataclass("ConfigFile", fields, frozen=True, kw_only=True)
    file.__doc__ = "A Ferry config file (TOML): every section optional, every key with a default."
    file.__pydantic_config__ = CONFIG  # type: ignore[attr-defined]  # the sections inherit it
    out = pydantic.TypeAdapter(file).json_schema()
    notes: dict[str, dict[str, str]] = {}
    for cls in (TenantConfig, ModelConfig, GuardrailConfig, Limits, *PLANE_SECTIONS.values(), *_nested()):
        notes[cls.__name__] = comments(cls)
    parts: list[type[Any]] = [ProxySettings, *_parts()]
    notes["ProxySection"] = {k: v for part in parts for k, v in comments(part).items()}
    for name, definition in out.get("$defs", {}).items():
        for key, prop in definition.get("properties", {}).items():
            if key in notes.get(name, {}) and "description" not in prop:
                prop["description"] = notes[name][key]
    out["$defs"]["ProxySection"]["properties"]["pick"] = pick_schema(out["$defs"])
    out["properties"]["guardrails"]["maxItems"] = MAX_GUARDRAILS
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "Ferry config file"
    return out


def pick_schema(defs: dict[str, Any]) -> dict[str, Any]:
    """``[proxy.pick]``'s schema from its declaration (PlanSettings), each type name a built-in plug-in's
    (a scorer file added to dataplane/pick/scorers/ joins the enum when the schema is drawn again).

    The scorer entry's definition goes to ``defs`` (the file's ``$defs``)."""
    from dataplane.pick.plugin import known
    from dataplane.pick.settings import PlanSettings

    table = pydantic.TypeAdapter(PlanSettings).json_schema()
    for name, definition in table.pop("$defs", {}).items():
        definition["additionalProperties"] = False
        defs[name] = definition
    table["additionalProperties"] = False
    props = table["properties"]
    props["filters"]["items"]["enum"] = known("filter", builtin=True)
    props["picker"]["enum"] = known("picker", builtin=True)
    defs["ScorerSettings"]["properties"]["type"]["enum"] = known("scorer", builtin=True)
    table["description"] = ("[proxy.pick]: the decision composed of plug-ins by type name (dataplane.pick.plugin); "
                            "the defaults decide as the built-in decision")
    return table


def _nested() -> list[type[Any]]:
    """Dataclasses inside the plane sections (the scaling targets)."""
    found = []
    for cls in PLANE_SECTIONS.values():
        for hint in typing.get_type_hints(cls).values():
            if dataclasses.is_dataclass(hint) and isinstance(hint, type):
                found.append(hint)
    return found


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.configschema", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--check", action="store_true", help="exit 1 when the committed schema is not current")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    text = render()
    out = Path(args.out)
    if args.check:
        current = out.exists() and out.read_text(encoding="utf-8") == text
        print(f"{out}: {'current' if current else 'stale: run python -m tools.configschema'}")
        return 0 if current else 1
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
