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
variables Hugging Face templates expect: ``messages``, ``add_generation_prompt``
(true), ``bos_token`` and ``eos_token`` (from the tokenizer config, else ""),
and ``raise_exception(message)``. The output is generated piece by piece and
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

DEFAULT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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

    def __init__(self, templates: Mapping[str, tuple[str, str, str]], *, max_bytes: int) -> None:
        self._env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False, autoescape=False)
        self._env.globals["raise_exception"] = _raise
        self._max_bytes = max_bytes
        self._compiled: dict[str, tuple[jinja2.Template, str, str]] = {}
        for model, (source, bos, eos) in templates.items():
            try:
                self._compiled[model] = (self._env.from_string(source), bos, eos)
            except jinja2.TemplateSyntaxError as exc:
                raise ConfigError(f"models.{model}.chat_template", f"line {exc.lineno}: {exc.message}") from None
        self._default = (self._env.from_string(DEFAULT_TEMPLATE), "", "")

    def render(self, model: str, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt of ``messages`` for ``model``; raises InvalidArgument naming ``messages``."""
        template, bos, eos = self._compiled.get(model, self._default)
        context: dict[str, Any] = {"messages": [dict(m) for m in messages], "add_generation_prompt": True,
                                   "bos_token": bos, "eos_token": eos}
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
