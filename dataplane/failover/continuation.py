"""Stream continuity: continue a stream whose replica died mid-way on another replica.

Algorithm: the proxy remembers what it already sent to the client (text and
token count, :class:`Delivered`). When the replica fails after output
started, :func:`continuable` says whether the failure is of the replica
(transport gone, UNAVAILABLE, INTERNAL, …: the retryable codes of
:mod:`dataplane.forward.kserve`) rather than of the request; :func:`continuation`
builds the next call: the original prompt followed by the delivered text
(exactly, so a language model resumes where it stopped), ``max_tokens``
reduced by the tokens delivered, and a request id suffixed ``-c<n>``. The
client sees one unbroken stream whose token count is the sum of both parts;
the summary (:meth:`Delivered.merge`) reports the original prompt tokens.

When it cannot continue (a request error, no replica left, the retry budget
or ``max_continuations``, default 2, used up) the stream ends with
UNAVAILABLE and :func:`cut_message` saying how many tokens were delivered;
a stream cut by the client's own deadline ends DEADLINE_EXCEEDED
(:func:`cut_error`), whichever side's timer fired first.

Pure, no I/O. Cost: the text delivered held per stream (bounded by max_tokens), as one string and at most
``JOIN_PIECES`` (64) pieces; joining copies it once per 64 pieces.
"""

from __future__ import annotations

import dataclasses

from dataplane.forward.kserve import RETRYABLE, Call, Outcome, Piece
from ferry.errors import DeadlineExceeded, FerryError, ReplicaFailed, Unavailable

JOIN_PIECES = 64  # pieces' texts kept apart before they are joined into one string


@dataclasses.dataclass(slots=True)
class Delivered:
    """What reached the client so far, across attempts."""

    tokens: int = 0
    before: int = 0  # tokens delivered by attempts before the current one
    continuations: int = 0
    texts: list[str] = dataclasses.field(default_factory=list)

    def add(self, piece: Piece) -> None:
        """A piece was sent to the client (the pieces' texts are joined every ``JOIN_PIECES``, so what a stream
        holds is its text, not thousands of small strings)."""
        self.tokens += piece.tokens
        texts = self.texts
        texts.append(piece.text)
        if len(texts) >= JOIN_PIECES:
            texts[:] = ["".join(texts)]

    @property
    def text(self) -> str:
        """The text sent so far."""
        return "".join(self.texts)

    def merge(self, last: Outcome, original: Call) -> Outcome:
        """The request's outcome: the last attempt's, with tokens and text counted over every attempt."""
        if not self.continuations:
            return last
        return dataclasses.replace(
            last, text=self.text, prompt_tokens=original.prompt_tokens,
            completion_tokens=self.before + last.completion_tokens,
        )


def continuable(error: FerryError) -> bool:
    """Whether a failure is the replica's (worth continuing elsewhere), not the request's."""
    if not isinstance(error, ReplicaFailed):
        return False
    kind = getattr(error, "kind", "")
    return error.retryable or (isinstance(kind, str) and kind.upper() in RETRYABLE)


def continuation(original: Call, delivered: Delivered) -> Call | None:
    """The call that resumes ``original`` after ``delivered``; None when nothing is left to generate."""
    left = original.max_tokens - delivered.tokens
    if left <= 0:
        return None
    delivered.continuations += 1
    delivered.before = delivered.tokens
    return dataclasses.replace(
        original,
        request_id=f"{original.request_id}-c{delivered.continuations}",
        prompt=original.prompt + delivered.text.encode("utf-8"),
        prompt_tokens=original.prompt_tokens + delivered.tokens,
        max_tokens=left,
    )


def cut_message(delivered: Delivered, error: FerryError, why: str) -> str:
    """The UNAVAILABLE message of a stream that could not be continued."""
    return f"stream cut after {delivered.tokens} token(s) delivered: {error}; not continued: {why}"


def cut_error(delivered: Delivered, error: FerryError, why: str) -> FerryError:
    """The error a stream that cannot be continued ends with: DEADLINE_EXCEEDED stays so, else UNAVAILABLE."""
    if isinstance(error, DeadlineExceeded):
        return DeadlineExceeded(cut_message(delivered, error, why))
    return Unavailable(cut_message(delivered, error, why))
