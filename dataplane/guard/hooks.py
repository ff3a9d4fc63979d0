"""Guardrail hooks on the request path: which hooks a request meets, what a verdict does, and the calls.

A hook is a ``ferry.v1.Guardrail`` server (proto/ferry/v1/guardrail.proto)
configured in the proxy's ``[[guardrails]]`` (:class:`ferry.config.GuardrailConfig`):
a stage, the models and tiers it applies to (empty: all), a timeout and an
``on_error`` choice.

- **Prompt** hooks run before the request waits in its tier queue (no slot
  is held while a classifier thinks), one after the other in config order:
  DENY refuses the request PERMISSION_DENIED with the hook's reason (HTTP
  403), REDACT replaces the prompt the next hook and the replica see.
- **Output** hooks see the answer in windows: a stream's pieces are held
  back until ``every_tokens`` tokens (the smallest of the request's output
  hooks) have come, the window is checked (with the last 4,096 bytes
  already released as context), then released with its pieces' chunking,
  replaced by the redaction as one piece, or, on DENY, withheld and the
  stream ended PERMISSION_DENIED (what was released stays released). A
  unary answer is one final window.
- A hook that fails or does not answer within ``timeout_ms`` (never past the
  request's deadline less 10 ms) follows ``on_error``: ``open`` lets the text
  through unchecked, ``closed`` ends the request UNAVAILABLE naming the hook.

Where it lives in the latency budget: a prompt hook's time comes before the
forward, so the replica's deadline is what is left of the request's
(:meth:`dataplane.router.Router.infer`); an output hook's time delays each
window's release, and a stream's first token by one window of decode plus
one call. Both are measured per hook (``ferry_proxy_guardrail_seconds{hook,stage}``,
``ferry_proxy_guardrail_verdicts_total{hook,stage,verdict}``, verdict one of
allow, deny, redact, failed_open, failed_closed) and summed per request into
the usage reports ``ferryctl top`` shows (``guard_ms``).

:func:`settle` (a verdict or a failure to the text to go on with) and
:func:`selected` are pure; :class:`Guards` owns the channels (a :class:`ferry.tls.Renewing` per hook: a
renewed certificate is presented from the next call on) and the calls.
Cost: one gRPC call per prompt hook, one per output hook and window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

import grpc

from dataplane.forward.kserve import Piece
from dataplane.metrics import ProxyMetrics
from ferry.config import GuardrailConfig
from ferry.errors import FerryError, PermissionDenied, Unavailable
from ferry.tls import Renewing, TLSConfig, channel
from ferry.v1 import guardrail_pb2, guardrail_pb2_grpc

CONTEXT_BYTES = 4096  # of the released answer sent with each output window
DEADLINE_MARGIN = 0.01  # seconds a hook call leaves before the request's deadline
STAGES = {"prompt": guardrail_pb2.GUARD_STAGE_PROMPT, "output": guardrail_pb2.GUARD_STAGE_OUTPUT}


class Refused(PermissionDenied):
    """A hook denied the prompt or a window of the answer: PERMISSION_DENIED, HTTP 403 ``guardrail_denied``."""


@dataclasses.dataclass(frozen=True)
class Selected:
    """The hooks one request meets: its prompt hooks, its output hooks and their window in tokens."""

    prompt: tuple[GuardrailConfig, ...] = ()
    output: tuple[GuardrailConfig, ...] = ()

    @property
    def window(self) -> int:
        """Tokens held back per output window: the smallest ``every_tokens`` of the output hooks."""
        return min((h.every_tokens for h in self.output), default=0)


NONE = Selected()


def selected(hooks: Sequence[GuardrailConfig], model: str, tier: str) -> Selected:
    """The hooks that apply to a request of ``model`` in ``tier`` (a hook's empty lists match everything)."""
    def applies(h: GuardrailConfig) -> bool:
        return (not h.models or model in h.models) and (not h.tiers or tier in h.tiers)

    chosen = [h for h in hooks if applies(h)]
    if not chosen:
        return NONE
    return Selected(prompt=tuple(h for h in chosen if h.stage == "prompt"),
                    output=tuple(h for h in chosen if h.stage == "output"))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What to do with the text a hook saw: ``verdict`` is the metric label, ``text`` what goes on."""

    verdict: str  # allow | deny | redact | failed_open | failed_closed
    text: str
    reason: str = ""


def settle(hook: GuardrailConfig, text: str, answer: guardrail_pb2.CheckResponse | None, failure: str = "") -> Verdict:
    """A hook's answer (or ``failure``, when it gave none) applied to ``text``; pure.

    ALLOW (or unspecified) keeps ``text``; DENY and REDACT as the module
    says; a failure follows the hook's ``on_error``.
    """
    if answer is None:
        if hook.on_error == "open":
            return Verdict("failed_open", text, failure)
        return Verdict("failed_closed", text, failure)
    if answer.action == guardrail_pb2.GUARD_ACTION_DENY:
        return Verdict("deny", text, answer.reason or "refused")
    if answer.action == guardrail_pb2.GUARD_ACTION_REDACT:
        return Verdict("redact", answer.text, answer.reason)
    return Verdict("allow", text)


@dataclasses.dataclass
class Subject:
    """The request a hook is asked about (its ``CheckRequest`` fields) and the guard time it has spent."""

    model: str
    tier: str
    tenant: str
    request_id: str
    deadline: float  # on the proxy's clock
    seconds: float = 0.0  # summed over every call made for this request


class Guards:
    """The configured hooks of one proxy: their channels, selection per request and the calls."""

    def __init__(self, hooks: Sequence[GuardrailConfig], metrics: ProxyMetrics, *,
                 clock: Callable[[], float], tls: TLSConfig | None = None) -> None:
        self.hooks = tuple(hooks)
        self._metrics = metrics
        self._clock = clock
        self._tls = tls
        self._clients: dict[str, Renewing[_HookClient]] = {}  # by address; rebuilt when the certificate is renewed
        self._selected: dict[tuple[str, str], Selected] = {}

    def select(self, model: str, tier: str) -> Selected:
        """The hooks a request of ``model`` in ``tier`` meets (memoised; bounded by models x tiers seen)."""
        if not self.hooks:
            return NONE
        key = (model, tier)
        found = self._selected.get(key)
        if found is None:
            if len(self._selected) >= 4096:
                self._selected.clear()
            found = self._selected[key] = selected(self.hooks, model, tier)
        return found

    async def prompt(self, hooks: Sequence[GuardrailConfig], subject: Subject, prompt: str) -> str:
        """Run the prompt hooks in order; the prompt to forward. Raises PermissionDenied or Unavailable."""
        for hook in hooks:
            prompt = await self._check(hook, subject, guardrail_pb2.CheckRequest(
                stage=STAGES["prompt"], text=prompt), prompt)
        return prompt

    async def output(self, hooks: Sequence[GuardrailConfig], subject: Subject, text: str, *, context: str = "",
                     final: bool) -> str:
        """Run the output hooks on one window; the text to release. Raises PermissionDenied or Unavailable."""
        for hook in hooks:
            text = await self._check(hook, subject, guardrail_pb2.CheckRequest(
                stage=STAGES["output"], text=text, context=context, final=final), text)
        return text

    async def released(self, hooks: Sequence[GuardrailConfig], window: int, subject: Subject,
                       pieces: AsyncIterator[Piece]) -> AsyncGenerator[Piece, None]:
        """``pieces`` released a window of ``window`` tokens at a time, each checked first (module doc)."""
        held: list[Piece] = []
        tokens = 0
        tail = ""
        async with contextlib.aclosing(pieces) as source:  # type: ignore[type-var]
            async for piece in source:
                held.append(piece)
                tokens += piece.tokens
                if tokens < window:
                    continue
                for out in await self._window(hooks, subject, held, tail, final=False):
                    tail = (tail + out.text)[-CONTEXT_BYTES:]
                    yield out
                held, tokens = [], 0
        for out in await self._window(hooks, subject, held, tail, final=True):
            yield out

    async def _window(self, hooks: Sequence[GuardrailConfig], subject: Subject, held: list[Piece], tail: str, *,
                      final: bool) -> list[Piece]:
        """One window checked: its pieces as they came, or the redaction as one piece."""
        text = "".join(p.text for p in held)
        if not text and not final:
            return held
        checked = await self.output(hooks, subject, text, context=tail, final=final)
        if checked == text:
            return held
        return ([Piece(checked, sum(p.tokens for p in held), tuple(lp for p in held for lp in p.logprobs))]
                if held or checked else [])

    async def _check(self, hook: GuardrailConfig, subject: Subject, request: guardrail_pb2.CheckRequest,
                     text: str) -> str:
        """Call ``hook`` once within its timeout and the deadline; count it; apply its verdict."""
        request.model, request.tier, request.tenant, request.request_id = (
            subject.model, subject.tier, subject.tenant, subject.request_id)
        start = self._clock()
        timeout = min(hook.timeout_ms / 1000.0, subject.deadline - start - DEADLINE_MARGIN)
        answer: guardrail_pb2.CheckResponse | None = None
        failure = ""
        if timeout <= 0:
            failure = "no time left before the request's deadline"
        else:
            try:
                async with self._client(hook.address).use() as client:
                    answer = await client.stub.Check(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                late = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                failure = f"no answer within {hook.timeout_ms:g} ms" if late else f"{exc.code().name}: {exc.details()}"
            except (TimeoutError, FerryError) as exc:
                failure = str(exc) or type(exc).__name__
        seconds = self._clock() - start
        subject.seconds += seconds
        stage = "prompt" if request.stage == STAGES["prompt"] else "output"
        verdict = settle(hook, text, answer, failure)
        self._metrics.guard_seconds.labels(hook.name, stage).observe(seconds)
        self._metrics.guard_verdicts.labels(hook.name, stage, verdict.verdict).inc()
        if verdict.verdict == "deny":
            raise Refused(f"guardrail {hook.name!r} refused the {stage}: {verdict.reason}")
        if verdict.verdict == "failed_closed":
            raise Unavailable(f"guardrail {hook.name!r} ({stage}) failed: {verdict.reason}; on_error is closed")
        return verdict.text

    def _client(self, address: str) -> Renewing[_HookClient]:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = Renewing(functools.partial(_HookClient, address, self._tls), self._tls)
        return client

    async def close(self) -> None:
        """Close the hooks' channels."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


class _HookClient:
    """A hook's channel (mutual TLS with the current certificate when ``tls``) and stub."""

    def __init__(self, address: str, tls: TLSConfig | None) -> None:
        self.channel = channel(address, tls)
        self.stub = guardrail_pb2_grpc.GuardrailStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
