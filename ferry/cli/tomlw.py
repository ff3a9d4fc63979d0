"""A minimal TOML writer for the config files ``ferry up`` generates.

Handles what Ferry's config uses: tables of scalars, lists of scalars,
inline tables inside a table (``region_rtt_ms = {"a:b" = 40.0}``), and
arrays of tables (``[[tenants]]``). Strings are written with JSON escaping,
which is valid TOML for basic strings.
"""

from __future__ import annotations

import json
from typing import Any


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table inside a section, e.g. region_rtt_ms = {"a:b" = 40.0}
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def _body(table: dict[str, Any], *, inline: bool = False) -> list[str]:
    return [f"{k} = {_scalar(v)}" for k, v in table.items() if inline or not isinstance(v, dict)]


def dumps(data: dict[str, Any]) -> str:
    """TOML text for ``data`` (top-level scalars, tables and arrays of tables)."""
    lines = _body({k: v for k, v in data.items() if not _is_table_array(v)})
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]", *_body(value, inline=True)]
        elif _is_table_array(value):
            for item in value:
                lines += ["", f"[[{key}]]", *_body(item, inline=True)]
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
