"""Where a simulated replica's answer ends: its natural end, a stop string, or ``max_tokens``.

Both faces of a replica (KServe v2 in :mod:`agent.replica.server`, HTTP in
``tools.peers.replicaface``) settle a request's :class:`Limit` with
:func:`answer_limit` when they admit it
(:meth:`agent.replica.runner.EngineRunner.submit_prompt`), and the engine is given that length
(:attr:`agent.replica.engine.EngineRequest.output_tokens`), so the steps and
the KV blocks follow the answer a client really gets.

An answer is ``min(natural, stop, max_tokens)`` words of
:func:`agent.replica.tensors.generated_text`, or tokens of a script (JSON, a
tool call: :mod:`agent.replica.model`), :meth:`Limit.text`:

- **natural**: the length at which the model would emit end-of-sequence.
  A model that ends with the same chance p after each token gives a
  geometric length; here ``natural = floor + G`` with G geometric on
  {0, 1, ...} of mean ``answer_tokens - floor`` (p = 1 / (mean - floor + 1)),
  drawn by inversion, G = ⌊ln u / ln(1 - p)⌋, from u in (0, 1] = the first
  8 bytes of BLAKE2b(prompt) + 1, over 2^64. The same prompt always gets
  the same length (tests stay deterministic); over many prompts the mean is
  ``answer_tokens``, never below ``floor`` (``answer_min_tokens``, default 8;
  a mean at or below the floor gives every answer the floor). The longest
  draw (u = 2^-64) is about floor + 44 x (mean - floor). Settings
  ``[replica] answer_tokens`` (0: off, every answer runs to ``max_tokens``,
  the default and what the fleet simulator assumes) and
  ``answer_min_tokens``; ``ignore_eos`` (vLLM's and SGLang's name) turns the
  natural end off for one request. A script's natural end is its last
  token, whatever ``answer_tokens`` and ``ignore_eos`` say.
- **stop**: the words before the first stop string, when the whole string
  falls inside the answer (the cut is at a word boundary:
  :func:`agent.replica.tensors.cut_at_stop`).
- ``finish_reason`` is ``stop`` when the answer ended naturally or at a stop
  string, ``length`` when ``max_tokens`` ended it (a natural length equal to
  ``max_tokens`` is ``length``: the budget ran out before the end token).

Cost: O(prompt) for the hash, O(longest stop string) for the stop cut: the
reply repeats a 10-word cycle, so a stop string that occurs in it occurs
first within two cycles plus its own length (:func:`_window`), whatever
``max_tokens`` is (by default the whole context on the HTTP face); O(script) for a script.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence

from agent.replica import tensors
from agent.replica.engine import EngineParams


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """How many words a request emits and why it ends there: ``stop`` (its end, or ``matched``) or ``length``;
    what they are: the tokens of ``script``, else the vocabulary's words."""

    words: int
    reason: str
    matched: str | None = None  # the stop string that ended it
    script: tuple[str, ...] | None = None  # the answer's tokens (None: tensors.generated_text)

    def text(self, start: int, count: int) -> str:
        """Tokens ``start`` to ``start + count - 1`` of the answer, joined."""
        return _text(self.script, start, count)

    def tokens(self, start: int, count: int) -> list[str]:
        """Tokens ``start`` to ``start + count - 1`` of the answer, each as it is written (they join into
        :meth:`text`)."""
        return [_text(self.script, i, 1) for i in range(start, start + count)]


def _text(script: tuple[str, ...] | None, start: int, count: int) -> str:
    return tensors.generated_text(start, count) if script is None else "".join(script[start:start + count])


def natural_length(prompt: str, mean: int, floor: int) -> int:
    """The natural length of the answer to ``prompt``: ``floor`` + a geometric draw of mean ``mean - floor``.

    Deterministic: u comes from BLAKE2b of the prompt (see the module docstring).
    """
    if mean <= floor:
        return floor
    digest = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 1) / 2.0**64  # (0, 1]
    keep = 1.0 - 1.0 / (mean - floor + 1)  # the chance of going on after each token
    return floor + math.floor(math.log(u) / math.log(keep))


def _window(stops: Sequence[str]) -> int:
    """Words of the reply that hold the first occurrence of any of ``stops``, if it occurs at all.

    After its first word the reply is periodic (one cycle of the vocabulary), so an occurrence anywhere has
    one starting within the first cycle; two cycles plus one word per character of the string cover its end.
    """
    return 2 * len(tensors.VOCABULARY) + max((len(s) for s in stops), default=0)


def answer_limit(prompt: str, max_tokens: int, stops: Sequence[str] = (), *, params: EngineParams | None = None,
                 ignore_eos: bool = False, script: tuple[str, ...] | None = None) -> Limit:
    """Where the answer to ``prompt`` ends: ``min(natural, stop, max_tokens)`` words, and why.

    ``params`` gives ``answer_tokens`` and ``answer_min_tokens`` (None or ``answer_tokens`` 0: no natural
    end); ``ignore_eos`` turns the natural end off; ``script``, the answer's tokens, ends it after them.
    """
    mean = params.answer_tokens if params is not None and not ignore_eos else 0
    natural = natural_length(prompt, mean, params.answer_min_tokens) if params is not None and mean > 0 else None
    if script is not None:
        natural = len(script)
    length = max_tokens if natural is None else min(natural, max_tokens)
    if any(stops):
        text = _text(script, 0, length if script is not None else min(length, _window(stops)))
        first = tensors.first_stop(text, stops)
        if first is not None:  # the words wholly before it, as tensors.cut_at_stop counts them
            return Limit(words=len(text[:first[0]].split()), reason="stop", matched=first[1], script=script)
    return Limit(words=length, reason="stop" if length < max_tokens else "length", script=script)
