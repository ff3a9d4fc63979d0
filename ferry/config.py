"""Config flows one way: a TOML file and flags, then frozen dataclasses, then constructors.

:func:`from_mapping` builds a frozen dataclass from a mapping and fails on the
first unknown or ill-typed key with :class:`ferry.errors.ConfigError` naming
its dotted path. Each plane declares the dataclass of the sections it reads;
the sections shared by several planes (tenants, models, limits) are here.

The declarations are the only description of the config: pydantic (v2)
validates a mapping against a dataclass's own fields (``extra="forbid"``,
strict types as TOML has them: an array makes a tuple, an integer a float,
never a string a number), then the dataclass's ``__post_init__`` checks its
ranges as before. The same declarations give the file's JSON Schema
(``python -m tools.configschema`` writes ``docs/config.schema.json``).

File layout (every section optional)::

    [[tenants]]      # read by the proxy; seeded into an empty store by the control plane
    name = "acme"
    api_key_sha256 = "…"            # sha256 hex of the API key; keys are never stored
    plan = "enterprise"              # free | paid | enterprise
    tiers = ["interactive", "standard", "batch"]
    requests_per_second = 50.0       # optional limits per proxy, 0 or absent: none
    tokens_per_second = 200000.0
    max_concurrency = 64

    [[models]]       # the catalog, read by the control plane
    name = "chat-large"
    default_version = "v1"
    min_gpus = 8
    tokenizer = "/models/chat-large/tokenizer.json"   # optional: its tokens (ferry.tokens); else words
    chat_template = "/models/chat-large/tokenizer_config.json"  # or the Jinja source; optional

    [[guardrails]]   # safety hooks the proxy calls (dataplane.guard), ferry.v1.Guardrail servers
    name = "keywords"
    address = "127.0.0.1:7001"
    stage = "prompt"                 # prompt (before the model) | output (on the answer, every_tokens at a time)
    models = ["chat-large"]          # optional: every model
    tiers = ["interactive"]          # optional: every tier
    timeout_ms = 50.0
    on_error = "closed"              # closed: refuse when it fails or is late | open: let the request on
    every_tokens = 32                # output: the window held back and checked before release

    [limits]         # read by the proxy
    [proxy]          # dataplane.config.ProxySettings
    [controlplane]   # controlplane.config.ControlPlaneSettings
    [scaling]        # controlplane.services.scaling.ScalingSettings (with [scaling.targets])
    [agent]          # agent.config.AgentSettings
    [replica]        # agent.replica.engine.EngineParams
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    import pydantic

from ferry.errors import ConfigError

T = TypeVar("T")

PLANE_SECTIONS = ("proxy", "controlplane", "scaling", "agent", "replica", "envoy")  # each read by its own plane
SECTIONS = ("tenants", "models", "guardrails", "limits", *PLANE_SECTIONS)
GUARD_STAGES = ("prompt", "output")
GUARD_ON_ERROR = ("closed", "open")
MAX_GUARDRAILS = 16  # hooks in one config; each costs a call per request it applies to
PLANS = ("free", "paid", "enterprise")
TIERS = ("interactive", "standard", "batch")


def positive(section: str, values: Mapping[str, float]) -> None:
    """Raise ConfigError naming ``section.key`` of the first value not above 0 (NaN included)."""
    for key, value in values.items():
        if not value > 0:  # also rejects NaN
            raise ConfigError(f"{section}.{key}", "must be positive")


def at_least_zero(section: str, values: Mapping[str, float]) -> None:
    """Raise ConfigError naming ``section.key`` of the first value below 0 (NaN included)."""
    for key, value in values.items():
        if not value >= 0:
            raise ConfigError(f"{section}.{key}", "must be >= 0")


def hash_api_key(key: str) -> str:
    """The stored form of an API key: its sha256 in hex."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class TenantConfig:
    """A customer: found from the API key; its plan and the tiers it may use."""

    name: str
    api_key_sha256: str
    plan: str = "paid"
    tiers: tuple[str, ...] = TIERS
    requests_per_second: float = 0.0   # rate limit per proxy (dataplane.admission.tenantlimits); 0: none
    tokens_per_second: float = 0.0     # prompt + max_tokens per second per proxy; 0: none
    max_concurrency: int = 0           # requests in flight per proxy; 0: none

    def __post_init__(self) -> None:
        for key in ("requests_per_second", "tokens_per_second", "max_concurrency"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"tenants.{self.name}.{key}", "must be >= 0 (0: no limit)")
        if self.plan not in PLANS:
            raise ConfigError(f"tenants.{self.name}.plan", f"must be one of {', '.join(PLANS)}")
        for tier in self.tiers:
            if tier not in TIERS:
                raise ConfigError(f"tenants.{self.name}.tiers", f"unknown tier {tier!r}")
        if len(self.api_key_sha256) != 64:
            raise ConfigError(f"tenants.{self.name}.api_key_sha256", "must be a sha256 in hex (64 characters)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A model of the catalog: a name, its default version, minimum GPU count, tokenizer file and chat template."""

    name: str
    default_version: str = "v1"
    min_gpus: int = 1
    tokenizer: str = ""  # a Hugging Face tokenizer.json (ferry.tokens); "": whitespace words
    # The Jinja chat template of /v1/chat/completions, or a path to a tokenizer_config.json whose
    # chat_template is used; empty: the default ChatML layout (dataplane.api.chat).
    chat_template: str = ""
    # The most tokens one answer may generate when the request sets no max_tokens (OpenAI's default: up to the
    # model's context); 0: [limits] max_tokens. The operator may lower it; a request's own max_tokens is not capped
    # by it (only by [limits] max_tokens and the context).
    max_output_tokens: int = 0
    # The format the model writes tool calls in (dataplane.api.tools): "hermes" (<tool_call>{json}</tool_call>,
    # which the default chat template offers tools for), or "none": it takes no tools (a request with some: 400).
    tool_parser: str = "hermes"

    def __post_init__(self) -> None:
        if self.max_output_tokens < 0:
            raise ConfigError(f"models.{self.name}.max_output_tokens", "must be >= 0 (0: no cap of its own)")
        if self.tool_parser not in TOOL_PARSERS:
            raise ConfigError(f"models.{self.name}.tool_parser", f"must be one of {', '.join(TOOL_PARSERS)}")


TOOL_PARSERS = ("hermes", "none")  # dataplane.api.tools.PARSERS


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardrailConfig:
    """A safety hook (``ferry.v1.Guardrail``) the proxy calls on the prompt or the answer (:mod:`dataplane.guard`).

    ``stage`` prompt (before the model) or output (each ``every_tokens`` of
    the answer held back and checked before release); ``models`` and
    ``tiers`` (empty: all) select the requests; ``timeout_ms`` bounds each
    call (never past the request's deadline); ``on_error`` closed refuses a
    request whose hook failed or was late, open lets it on.
    """

    name: str
    address: str
    stage: str = "prompt"
    models: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()
    timeout_ms: float = 50.0
    on_error: str = "closed"
    every_tokens: int = 32

    def __post_init__(self) -> None:
        where = f"guardrails.{self.name}"
        if not self.name or not self.address:
            raise ConfigError(f"{where}.address" if self.name else "guardrails.name", "must not be empty")
        if self.stage not in GUARD_STAGES:
            raise ConfigError(f"{where}.stage", f"must be one of {', '.join(GUARD_STAGES)}")
        if self.on_error not in GUARD_ON_ERROR:
            raise ConfigError(f"{where}.on_error", f"must be one of {', '.join(GUARD_ON_ERROR)}")
        if not 0 < self.timeout_ms <= 60_000:
            raise ConfigError(f"{where}.timeout_ms", "must be in (0, 60000]")
        if not 1 <= self.every_tokens <= 4096:
            raise ConfigError(f"{where}.every_tokens", "must be in [1, 4096]")
        for tier in self.tiers:
            if tier not in TIERS:
                raise ConfigError(f"{where}.tiers", f"unknown tier {tier!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on public requests, enforced by the proxy."""

    max_prompt_bytes: int = 4 * 1024 * 1024
    max_tokens: int = 8192
    max_model_bytes: int = 128
    max_version_bytes: int = 64
    max_prefix_key_bytes: int = 256
    max_idempotency_key_bytes: int = 128
    max_message_bytes: int = 8 * 1024 * 1024
    max_inflight_per_tenant: int = 1024  # requests of one tenant in flight in one proxy
    max_streams_per_connection: int = 4096  # concurrent calls on one client connection (HTTP/2 streams)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileConfig:
    """The sections of a config file, each still a raw mapping except the shared ones."""

    tenants: tuple[TenantConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()
    guardrails: tuple[GuardrailConfig, ...] = ()
    limits: Limits = dataclasses.field(default_factory=Limits)
    sections: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def section(self, cls: type[T], name: str) -> T:
        """Build the plane-owned dataclass ``cls`` from section ``name`` (defaults when absent)."""
        return from_mapping(cls, self.sections.get(name, {}), name)


def load_file(path: str | Path | None) -> FileConfig:
    """Read a TOML config file; None gives the defaults."""
    if path is None:
        return FileConfig()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(str(path), "file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from exc
    return parse(data)


def parse(data: Mapping[str, Any]) -> FileConfig:
    """Validate the top level of a config mapping and build the shared sections."""
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(key, f"unknown section (known: {', '.join(SECTIONS)})")
    tenants = tuple(from_mapping(TenantConfig, t, f"tenants[{i}]") for i, t in enumerate(data.get("tenants", [])))
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ConfigError("tenants", "tenant names must be unique")
    models = tuple(from_mapping(ModelConfig, m, f"models[{i}]") for i, m in enumerate(data.get("models", [])))
    raw_guards = data.get("guardrails", [])
    if not isinstance(raw_guards, list):
        raise ConfigError("guardrails", "must be an array of tables ([[guardrails]])")
    if len(raw_guards) > MAX_GUARDRAILS:
        raise ConfigError("guardrails", f"at most {MAX_GUARDRAILS} hooks")
    guardrails = tuple(from_mapping(GuardrailConfig, g, f"guardrails[{i}]") for i, g in enumerate(raw_guards))
    if len({g.name for g in guardrails}) != len(guardrails):
        raise ConfigError("guardrails", "hook names must be unique")
    limits = from_mapping(Limits, data.get("limits", {}), "limits")
    other = {k: v for k, v in data.items() if k in PLANE_SECTIONS}
    return FileConfig(tenants=tenants, models=models, guardrails=guardrails, limits=limits, sections=other)


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build frozen dataclass ``cls`` from ``data``; unknown or ill-typed keys raise ConfigError.

    Validated by pydantic against ``cls``'s own declaration (:func:`_adapter`); the first error is
    raised as ConfigError naming its dotted path under ``where`` (``proxy.queue_bounds[1]``). A
    ``__post_init__`` check raises its own ConfigError as before.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(where, "must be a table")
    # pydantic's strict JSON mode types values as TOML does: an array makes a tuple, a table a dataclass, an
    # integer a float; a string is never a number nor a number a bool (strict Python mode wants tuples and instances)
    text = json.dumps([data], default=_unsupported)
    import pydantic  # here: a process that reads no config does not pay its import (tools.bench.config)

    try:
        return cast(T, _adapter(cls).validate_json(text)[0])
    except pydantic.ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = error["loc"][1:]  # past the 1-tuple of _adapter
        key = where + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
        if error["type"] == "unexpected_keyword_argument":
            known = _fields_at(cls, loc[:-1])
            raise ConfigError(key, "unknown key" + (f" (known: {', '.join(known)})" if known else "")) from None
        if error["type"] == "missing":
            raise ConfigError(key, "required") from None
        got = type(error["input"]).__name__ if not isinstance(error["input"], dict) else "table"
        raise ConfigError(key, f"{error['msg'].replace('Input should', 'must')}, got {got}") from None


def _adapter(cls: type[Any]) -> pydantic.TypeAdapter[tuple[Any]]:
    """The validator of ``cls``: built once per class from its declaration (field types, defaults).

    pydantic takes no config on a dataclass type itself, and a plain dataclass inherits its parent's:
    the 1-tuple carries ``extra="forbid"`` and strict types to ``cls`` and the dataclasses inside it.
    Kept per class (the declared classes: a bounded set).
    """
    import pydantic

    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = pydantic.TypeAdapter(tuple[cls], config=CONFIG)  # type: ignore[valid-type,arg-type]
    return adapter


_ADAPTERS: dict[type[Any], pydantic.TypeAdapter[tuple[Any]]] = {}


CONFIG: pydantic.ConfigDict = {"extra": "forbid", "strict": True}  # how every section is validated (and drawn)


def _unsupported(value: Any) -> Any:
    """A TOML value JSON has no type for (a date): a table no declared scalar or array accepts."""
    return {"unsupported": type(value).__name__}


def _fields_at(cls: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the dataclass reached from ``cls`` along ``loc`` ([] when it leads elsewhere)."""
    for part in loc:
        if dataclasses.is_dataclass(cls) and isinstance(part, str):
            cls = typing.get_type_hints(cls).get(part)
        elif typing.get_origin(cls) is tuple and isinstance(part, int):
            cls = typing.get_args(cls)[0]
        else:
            return []
    return sorted(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else []
