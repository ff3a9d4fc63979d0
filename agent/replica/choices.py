"""OpenAI's shapes of a simulated chat answer: its message, its streamed deltas, and the usage of n choices.

Pure. An answer is a **tool call** when the model's script is one
(:class:`agent.replica.model.Script`) and the answer carries it whole: all
its tokens, ended naturally (:func:`is_call`). Then the message is
``{"role": "assistant", "content": null, "tool_calls": [{"id": "call_...",
"type": "function", "function": {"name", "arguments"}}]}`` (arguments: JSON
text) with finish_reason ``tool_calls``; streamed (:class:`Deltas`), a first
delta ``{"role": "assistant", "content": null}``, then, once the tokens
have passed the name, ``tool_calls`` ``[{"index": 0, "id", "type",
"function": {"name", "arguments": the part written so far}}]``, then one
delta per step with the next part of the arguments (``{"index": 0,
"function": {"arguments"}}``), as OpenAI streams them. Any other answer
(words, JSON, a call cut by ``max_tokens`` or a stop string) is its text as
``content`` with its own finish_reason; streamed, ``{"role": "assistant",
"content": ""}`` then the text of each step.

Cost: O(tokens of a step) per delta.
"""

from __future__ import annotations

import uuid
from typing import Any

from agent.replica.answer import Limit
from agent.replica.model import Script


def is_call(script: Script | None, answer: Limit) -> bool:
    """Whether ``answer`` (the ticket's) carries the whole tool call of ``script``."""
    return script is not None and script.call and answer.reason == "stop" and answer.words == len(script.tokens)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def message(script: Script | None, answer: Limit, emitted: int) -> tuple[dict[str, Any], str]:
    """The message of a finished answer of ``emitted`` tokens, and its finish_reason."""
    if script is not None and is_call(script, answer):
        start, end = script.arguments
        call = {"id": _call_id(), "type": "function",
                "function": {"name": script.name, "arguments": script.text[start:end]}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    return {"role": "assistant", "content": answer.text(0, emitted)}, answer.reason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage``: the prompt once, the completion tokens of every choice, the cached prompt tokens."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class Deltas:
    """The streamed deltas of one chat choice as its tokens arrive (see the module docstring)."""

    def __init__(self, script: Script | None, answer: Limit) -> None:
        self.answer = answer
        self.call = script if script is not None and is_call(script, answer) else None
        self.text = self.call.text if self.call is not None else ""
        self.sent = 0  # tokens so far
        self.chars = 0  # characters of the call's text so far
        self.released = -1  # characters of the call's arguments sent (-1: not even its header)
        self.id = _call_id()

    def first(self) -> dict[str, Any]:
        """The first delta: the role."""
        return {"role": "assistant", "content": None if self.call is not None else ""}

    def feed(self, count: int) -> dict[str, Any] | None:
        """The delta for the next ``count`` tokens (None: nothing to send yet)."""
        piece = self.answer.text(self.sent, count)
        self.sent += count
        if self.call is None:
            return {"content": piece} if piece else None
        self.chars += len(piece)
        start, end = self.call.arguments
        if self.chars < start:
            return None
        upto = min(self.chars, end) - start
        if self.released < 0:
            self.released = upto
            return {"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                                    "function": {"name": self.call.name, "arguments": self.text[start:start + upto]}}]}
        if upto == self.released:
            return None
        arguments, self.released = self.text[start + self.released:start + upto], upto
        return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}

    @property
    def finish_reason(self) -> str:
        """Why the choice ended: ``tool_calls`` for a call, else the answer's reason."""
        return "tool_calls" if self.call is not None else self.answer.reason
