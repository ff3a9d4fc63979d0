"""What the test models served by ``tools/triton/serve.py`` compute: plain text, no numpy, no Triton.

Kept apart from the server so that the behaviour is stated once and can be
checked from the main environment.

- ``batchstring``: one output per input, in order: the input upper-cased.
- ``llm``: a stand-in for a language model. It "generates" ``max_tokens``
  whitespace words by cycling through the prompt's words (``"token"`` for an
  empty prompt). Unary: the words joined by single spaces. Streaming: one chunk
  per word, each the text since the previous chunk (``"a"``, ``" b"``, ``" c"``),
  so the chunks concatenate to the unary text.

Cost: O(max_tokens); ``max_tokens`` is clipped to ``MAX_TOKENS_LIMIT``.
"""

from __future__ import annotations

MAX_TOKENS_LIMIT = 4096
EMPTY_PROMPT_WORD = "token"


def batchstring(inputs: list[str]) -> list[str]:
    """The fixed-batch contract model: exactly one output per input, same order."""
    return [text.upper() for text in inputs]


def generate_words(prompt: str, max_tokens: int) -> list[str]:
    """The words the ``llm`` model generates for ``prompt``: ``max_tokens`` of them (0 when negative)."""
    count = max(0, min(int(max_tokens), MAX_TOKENS_LIMIT))
    words = prompt.split() or [EMPTY_PROMPT_WORD]
    return [words[i % len(words)] for i in range(count)]


def stream_chunks(words: list[str]) -> list[str]:
    """One streamed chunk per word: the text added since the previous chunk."""
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


def unary_text(words: list[str]) -> str:
    """The whole generated text, as a unary (non-streaming) response carries it."""
    return " ".join(words)
