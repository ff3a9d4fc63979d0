"""The simulated model: what a Ferry replica answers, the same on both faces.

Pure, no I/O. The model answers one of three things, the first that applies:

1. **A tool call**, when tools are offered and the conversation does not
   already end with a tool's result:

   - KServe face (:func:`kserve_script`: a prompt a chat template rendered,
     docs/CONTRACTS.md, Tool calls): tools are offered when the prompt has a
     line that is exactly ``<tools>`` and, on the lines after it up to one
     that starts with ``</tools>``, a JSON object naming a function
     (OpenAI's ``{"type": "function", "function": {"name", "parameters"}}`` or
     a bare ``{"name", "parameters"}``); the last such block counts. The
     conversation ends with a tool's result when, after the prompt's last
     ``</tool_response>``, there is nothing but whitespace, ``<|...|>``
     special tokens and the word ``assistant`` (the generation prompt).
   - HTTP face (:func:`chat_script`, OpenAI's chat body): ``tools`` is not
     empty, ``tool_choice`` is not ``none``, and the last message's role is
     not ``tool``.

   The answer is the ``hermes`` block ``<tool_call>\\n{"name": NAME,
   "arguments": ARGUMENTS}\\n</tool_call>``: NAME the first function offered
   (on the HTTP face, a named ``tool_choice`` picks it), ARGUMENTS the
   instance of its ``parameters`` (:func:`agent.replica.instance.instance`;
   none: ``{}``). The KServe face writes the block (the proxy parses it); the
   HTTP face answers OpenAI's ``tool_calls`` with finish_reason ``tool_calls``.
   A tool call comes first even under a schema (the model calls, then
   answers in the schema once the tool's result is in).
2. **JSON**, when a schema is given (``guided_json`` on the KServe face,
   ``response_format`` ``json_object`` or ``json_schema`` on the HTTP face):
   the instance of the schema, written by ``json.dumps`` (ASCII, separators
   ``", "`` and ``": "``).
3. **Words** otherwise: the vocabulary cycle of
   :func:`agent.replica.tensors.generated_text`.

A scripted answer (1 or 2) is cut into tokens at whitespace
(:func:`tokens`: each token a run of whitespace and the word after it), so
every response's token count is its whitespace words, as the proxy counts
them, and the pieces join into the text. It ends after its last token
(finish_reason ``stop``; ``[replica] answer_tokens`` and ``ignore_eos`` do
not change that: the schema or the call ends it), sooner at a stop string,
or at ``max_tokens`` (``length``; an unfinished call is then text, not a
call): :func:`agent.replica.answer.answer_limit`.

Every bad input raises InvalidArgument naming its field (``guided_json``,
``text_input`` for a tool's schema in the prompt, ``tools[i]...``,
``tool_choice``, ``response_format...``). Cost: O(prompt) to find the tools,
plus the instance's (bounded: :mod:`agent.replica.instance`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agent.replica.instance import SchemaError, instance
from ferry.errors import InvalidArgument

MAX_TOOLS = 128  # OpenAI's bound on tools per request
OBJECT = {"type": "object"}  # json_object, and a function without parameters
_TOKEN = re.compile(r"\s*\S+")
_SPECIAL = re.compile(r"<\|[^|<>]{0,64}\|>")


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """A scripted answer: its tokens; for a tool call, the function's name and where its arguments stand."""

    tokens: tuple[str, ...]
    name: str = ""  # the function called ("" for JSON)
    arguments: tuple[int, int] = (0, 0)  # [start, end) of the arguments' JSON in the text

    @property
    def text(self) -> str:
        """The whole answer."""
        return "".join(self.tokens)

    @property
    def call(self) -> bool:
        """Whether the answer is a tool call."""
        return bool(self.name)


def tokens(text: str) -> tuple[str, ...]:
    """``text`` as tokens: each a run of whitespace and the word after it (trailing whitespace is dropped)."""
    return tuple(_TOKEN.findall(text))


def json_script(schema: object, field: str) -> Script:
    """The JSON answer to ``schema``; InvalidArgument naming ``field`` when it has no instance."""
    try:
        return Script(tokens(json.dumps(instance(schema))))
    except SchemaError as exc:
        raise InvalidArgument(field, f"no JSON value matches the schema at {exc}") from None


def call_script(name: str, parameters: object, field: str) -> Script:
    """The hermes block calling ``name`` with an instance of ``parameters`` (None: none); InvalidArgument naming
    ``field`` when the schema has no instance or its instance is not an object."""
    try:
        arguments = instance(OBJECT if parameters is None else parameters)
    except SchemaError as exc:
        raise InvalidArgument(field, f"no arguments match the schema at {exc}") from None
    if not isinstance(arguments, dict):
        raise InvalidArgument(field, f"must describe an object, not {type(arguments).__name__} arguments")
    head = f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": '
    body = json.dumps(arguments)
    return Script(tokens(f"{head}{body}}}\n</tool_call>"), name, (len(head), len(head) + len(body)))


# -- the KServe face: a rendered prompt ----------------------------------------------------------------------------

def offered_tool(prompt: str) -> tuple[str, object] | None:
    """The first function of the prompt's last tools block: ``(name, parameters)``; None when none is offered."""
    start = prompt.rfind("\n<tools>\n")
    if start < 0 and not prompt.startswith("<tools>\n"):
        return None
    pos = start + len("\n<tools>\n") if start >= 0 else len("<tools>\n")
    while pos < len(prompt):  # line by line, up to the first function (not the whole rest of the prompt)
        end = prompt.find("\n", pos)
        end = len(prompt) if end < 0 else end
        line, pos = prompt[pos:end], end + 1
        if line.startswith("</tools>"):
            return None
        try:
            tool = json.loads(line)
        except (ValueError, RecursionError):
            continue
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            return function["name"], function.get("parameters")
    return None


def ends_with_tool_result(prompt: str) -> bool:
    """Whether nothing but template markup follows the prompt's last ``</tool_response>`` (see the docstring)."""
    end = prompt.rfind("</tool_response>")
    if end < 0:
        return False
    tail = _SPECIAL.sub(" ", prompt[end + len("</tool_response>"):])
    return all(word == "assistant" for word in tail.split())


def kserve_script(prompt: str, guided_json: Sequence[str] | None) -> Script | None:
    """What the model answers to a KServe request: a tool call, JSON for ``guided_json``, or None (words)."""
    tool = offered_tool(prompt)
    if tool is not None and not ends_with_tool_result(prompt):
        return call_script(tool[0], tool[1], "text_input")
    if guided_json is None:
        return None
    if len(guided_json) != 1:
        raise InvalidArgument("guided_json", f"expected one JSON Schema, got {len(guided_json)} elements")
    try:
        schema = json.loads(guided_json[0])
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("guided_json", f"not JSON: {exc}") from None
    return json_script(schema, "guided_json")


# -- the HTTP face: OpenAI's request body -----------------------------------------------------------------------

def response_script(body: Mapping[str, Any]) -> Script | None:
    """The JSON answer ``response_format`` asks for (None: ``text``, or absent)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_script(OBJECT, "response_format")
    if kind != "json_schema":
        raise InvalidArgument("response_format", "must be an object whose type is text, json_object or json_schema")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidArgument("response_format.json_schema", "required with type json_schema: an object")
    schema = spec.get("schema", OBJECT)
    if not isinstance(schema, (dict, bool)):
        raise InvalidArgument("response_format.json_schema.schema", "must be a JSON Schema (an object)")
    return json_script(schema, "response_format.json_schema.schema")


def chat_script(body: Mapping[str, Any]) -> Script | None:
    """What the model answers to an OpenAI chat body: a tool call, JSON for ``response_format``, or None (words)."""
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    named = _named_choice(choice, tools)
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    after_tool = isinstance(last, dict) and last.get("role") == "tool"
    schema = response_script(body)  # validated even when a call comes first
    if tools and choice != "none" and not after_tool:
        name = named or next(iter(tools))
        return call_script(name, tools[name], f"tools[{list(tools).index(name)}].function.parameters")
    return schema


def _tools(value: object) -> dict[str, object]:
    """The functions of ``tools``, name -> parameters (None: none given), in order."""
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise InvalidArgument("tools", f"must be a list of at most {MAX_TOOLS} tools")
    out: dict[str, object] = {}
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise InvalidArgument(f"tools[{i}]", 'must be {"type": "function", "function": {...}}')
        name, parameters = function.get("name"), function.get("parameters")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"tools[{i}].function.name", "required: a non-empty string")
        if parameters is not None and not isinstance(parameters, (dict, bool)):
            raise InvalidArgument(f"tools[{i}].function.parameters", "must be a JSON Schema (an object)")
        out.setdefault(name, parameters)
    return out


def _named_choice(choice: object, tools: Mapping[str, object]) -> str | None:
    """The function a ``tool_choice`` names (None: ``auto``, ``required``, ``none`` or absent)."""
    if choice is None or choice in ("auto", "required", "none"):
        return None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidArgument("tool_choice", 'must be none, auto, required or {"type": "function", '
                                             '"function": {"name": ...}}')
    if name not in tools:
        raise InvalidArgument("tool_choice", f"function {name[:64]!r} is not among the tools")
    return name
