"""Tool calls in the ``hermes`` format: which tools a chat offers the model, and the calls out of its answer.

Pure, no I/O. A model's ``[[models]] tool_parser`` names the format it writes calls in (``hermes``, the
default; ``none``: it takes no tools, and a request offering some is a 400 naming ``tools`` and the model).
The chat template renders the offered tools (:func:`offered`; :mod:`dataplane.api.chat`), and the model
calls one by writing, anywhere in its answer::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

:func:`parse` takes every such block out of a whole answer: the calls (each given an id, its arguments as a
JSON string, as OpenAI's ``tool_calls`` carry them) and the text outside them (the message's content; None
when only whitespace is left). A block whose body is not a JSON object with a string ``name`` stays in the
content, as text. :class:`Stream` does the same on a streamed answer, piece by piece: text is released as
it comes, except from an opening tag (or what may become one: a trailing ``<tool_c``) to its closing tag,
held back, at most :data:`MAX_CALL_CHARS` (beyond, it is released as text).

``tool_choice``: ``none`` offers nothing (the template renders no tools, nothing is parsed); ``auto``
(the default with tools), ``required`` and a named function offer them; a named function not among the
tools is a 400 naming ``tool_choice``. Whether the model then calls is the model's: ``required`` is not
enforced by the proxy.

Cost: one scan of the answer for the opening tag; O(length of the calls) to parse them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.errors import InvalidArgument

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALL_CHARS = 64 * 1024  # a tool call held back while streamed; a longer one is released as text


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One tool call: its id, the function's name and its arguments (JSON text)."""

    id: str
    name: str
    arguments: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry (``index`` in a streamed delta)."""
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def offered(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any] | None, *, model: str,
            parser: str) -> list[dict[str, Any]]:
    """The tools the template renders for a request (none when there are none, or ``tool_choice`` is ``none``);
    raises InvalidArgument naming ``tools`` when the model takes none, ``tool_choice`` for an unknown function."""
    if not tools or tool_choice == "none":
        return []
    if parser == "none":
        raise InvalidArgument("tools", f"model {model!r} does not call tools (its tool_parser is none)",
                              "unsupported_parameter")
    names = {tool["function"]["name"] for tool in tools}
    if isinstance(tool_choice, Mapping):
        name = tool_choice["function"]["name"]
        if name not in names:
            raise InvalidArgument("tool_choice", f"function {name[:64]!r} is not among the tools")
    return [dict(tool) for tool in tools]


def _call(body: str) -> Call | None:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return Call(id=f"call_{uuid.uuid4().hex[:24]}", name=data["name"], arguments=text)


def parse(text: str) -> tuple[str | None, list[Call]]:
    """The content and the calls of a whole answer (see the module docstring)."""
    if OPEN not in text:
        return text, []
    content: list[str] = []
    calls: list[Call] = []
    rest = text
    while (start := rest.find(OPEN)) >= 0:
        end = rest.find(CLOSE, start + len(OPEN))
        if end < 0:
            break
        call = _call(rest[start + len(OPEN):end])
        content.append(rest[:start] if call is not None else rest[:end + len(CLOSE)])
        if call is not None:
            calls.append(call)
        rest = rest[end + len(CLOSE):]
    content.append(rest)
    joined = "".join(content)
    return (joined if joined.strip() else None), calls


class Stream:
    """:func:`parse` over a streamed answer: :meth:`feed` each piece, :meth:`end` after the last; each returns
    what to send now, as ``(text, calls)``: text to release ("" none) and the calls completed."""

    def __init__(self) -> None:
        self._held = ""  # from an opening tag (or the start of one) on
        self.calls = 0  # calls released so far

    def feed(self, piece: str) -> tuple[str, list[Call]]:
        """What ``piece`` (after what was held) lets out."""
        text = self._held + piece
        self._held = ""
        released: list[str] = []
        calls: list[Call] = []
        while text:
            start = text.find(OPEN)
            if start < 0:
                keep = _partial_open(text)
                released.append(text[:len(text) - keep])
                self._held = text[len(text) - keep:]
                break
            released.append(text[:start])
            end = text.find(CLOSE, start + len(OPEN))
            if end < 0:
                if len(text) - start > MAX_CALL_CHARS:  # too long to be a call: text after all
                    released.append(text[start:])
                else:
                    self._held = text[start:]
                break
            call = _call(text[start + len(OPEN):end])
            if call is None:
                released.append(text[start:end + len(CLOSE)])
            else:
                calls.append(call)
            text = text[end + len(CLOSE):]
        self.calls += len(calls)
        return "".join(released), calls

    def end(self) -> str:
        """What is still held (an unclosed call: text after all)."""
        held, self._held = self._held, ""
        return held


def _partial_open(text: str) -> int:
    """How many characters at the end of ``text`` may begin an opening tag (held back until the next piece)."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
