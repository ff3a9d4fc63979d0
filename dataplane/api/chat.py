"""Chat templates: a model's messages to one prompt, rendered in Jinja's immutable sandbox with a bounded output.

A model's template comes from its ``[[models]]`` entry (``chat_template``,
:class:`ferry.config.ModelConfig`): the Jinja source itself, or a path to a
Hugging Face ``tokenizer_config.json`` whose ``chat_template`` key is used
(read once, at start, by :func:`load_template`). A model without one uses
:data:`DEFAULT_TEMPLATE`, a ChatML layout::

    <|im_start|>{role}\n{content}<|im_end|>\n   (each message)
    <|im_start|>assistant\n                     (the generation prompt)

Templates render in :class:`jinja2.sandbox.ImmutableSandboxedEnvironment`
(no attribute access to internals, no mutation of the messages) with the
variables Hugging Face templates expect: ``messages``, ``tools`` (the offered
tools, :mod:`dataplane.api.tools`; none: undefined-falsy), ``add_generation_prompt``
(true), ``bos_token`` and ``eos_token`` (from the tokenizer config, else ""),
and ``raise_exception(message)``. The default layout renders tools in the
``hermes`` way (docs/CONTRACTS.md, Tool calls). The output is generated piece by piece and
refused (InvalidArgument ``messages``) once it passes ``max_bytes``, so a
template looping over a large input cannot exhaust memory; a template that
fails to render is refused naming ``messages`` with the template's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ferry.errors import ConfigError, InvalidArgument

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FORMAT = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
DEFAULT_TEMPLATE = (
    # the offered tools, in the system turn (after the caller's system message, when the first is one)
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}{{ tools_preamble }}"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{{ tools_format }}<|im_end|>\n{% endif %}"
    # each message; a tool's result as a <tool_response>, an assistant's calls as <tool_call> blocks
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% elif message['role'] == 'assistant' and message['tool_call_texts'] %}<|im_start|>assistant\n"
    "{{ message['content'] }}{% for call in message['tool_call_texts'] %}<tool_call>\n{{ call }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def call_text(call: Mapping[str, Any]) -> str:
    """An earlier assistant call as the model wrote it: ``{"name": ..., "arguments": {...}}``."""
    function = call.get("function", {})
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = function.get("arguments")
    return json.dumps({"name": function.get("name", ""), "arguments": arguments}, ensure_ascii=False)


class TemplateError(Exception):
    """A template called ``raise_exception``."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def load_template(source: str, where: str) -> tuple[str, str, str]:
    """``(template, bos_token, eos_token)`` of a ``chat_template`` value: Jinja source, or a tokenizer_config.json path.

    Raises ConfigError naming ``where`` when the file cannot be read or has no ``chat_template``.
    """
    if not source:
        return DEFAULT_TEMPLATE, "", ""
    if "{{" in source or "{%" in source:
        return source, "", ""
    try:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(where, f"neither a Jinja template nor a readable tokenizer_config.json: {exc}") from None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(template, list):  # named templates: the "default" one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if not isinstance(template, str) or not template:
        raise ConfigError(where, f"{source} has no chat_template string")

    def token(name: str) -> str:
        value = data.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    return template, token("bos_token"), token("eos_token")


class ChatTemplates:
    """Each model's compiled chat template; :meth:`render` turns messages into a prompt of at most ``max_bytes``."""

    def __init__(self, templates: Mapping[str, tuple[str, str, str]], *, max_bytes: int,
                 tool_parsers: Mapping[str, str] | None = None) -> None:
        self._env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False, autoescape=False)
        self._env.globals.update(raise_exception=_raise, tools_preamble=TOOLS_PREAMBLE, tools_format=TOOLS_FORMAT)
        self._max_bytes = max_bytes
        self._parsers = dict(tool_parsers or {})  # model -> tool_parser ([[models]]; absent: hermes)
        self._compiled: dict[str, tuple[jinja2.Template, str, str]] = {}
        for model, (source, bos, eos) in templates.items():
            try:
                self._compiled[model] = (self._env.from_string(source), bos, eos)
            except jinja2.TemplateSyntaxError as exc:
                raise ConfigError(f"models.{model}.chat_template", f"line {exc.lineno}: {exc.message}") from None
        self._default = (self._env.from_string(DEFAULT_TEMPLATE), "", "")

    def tool_parser(self, model: str) -> str:
        """The format ``model`` writes tool calls in (:mod:`dataplane.api.tools`): ``hermes`` or ``none``."""
        return self._parsers.get(model, "hermes")

    def render(self, model: str, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt of ``messages`` (and the ``tools`` offered) for ``model``; raises InvalidArgument naming
        ``messages``. Each message also carries ``tool_call_texts``: its ``tool_calls`` as the model wrote them."""
        template, bos, eos = self._compiled.get(model, self._default)
        context: dict[str, Any] = {
            "messages": [{**m, "tool_call_texts": [call_text(c) for c in m.get("tool_calls") or ()]}
                         for m in messages],
            "tools": [dict(t) for t in tools] or None, "add_generation_prompt": True, "bos_token": bos,
            "eos_token": eos}
        pieces: list[str] = []
        size = 0
        try:
            for piece in template.generate(context):
                size += len(piece.encode())
                if size > self._max_bytes:
                    raise InvalidArgument("messages", f"the chat template's output exceeds {self._max_bytes} bytes")
                pieces.append(piece)
        except (TemplateError, jinja2.TemplateError) as exc:
            raise InvalidArgument("messages", f"the chat template refused them: {exc}") from None
        return "".join(pieces)
