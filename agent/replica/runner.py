"""The real-time driver of one :class:`agent.replica.engine.Engine`: one asyncio task per replica.

Loop: ``start_step(now)``; when it returns a duration, sleep that long, then
``finish_step(now)`` and hand each request its tokens; when it returns None,
wait until a request is submitted. An idle replica costs no CPU.

The model's clock, not the host's: a sleep ends late (asyncio's timers wake
on whole milliseconds of ``epoll``; about 0.75 ms late per step on average on the
2-core development machine), and a replica that added that to every step
would run slower than its parameters say. So steps run back to back on the
model's clock: a step of a busy replica starts when the previous one was due
to end, and sleeps until its own end is due (less, or not at all, after a
late wake), so lateness does not add up over a busy period; and each sleep
is aimed early by the timer's median lateness, learnt as it goes (a step
of ``AIM_STEP`` toward it at each wake-up, at most ``MAX_AIM_SECONDS``; the
median, not the mean, because a host busy elsewhere makes some wake-ups very
late, and aiming early by those would end the quiet steps early), so a
wake-up lands on the model's clock as often early as late, and the last step
of a busy period, which nothing catches up, too. A lag over
``CATCH_UP_SECONDS`` (the host stalled) is not caught up: the next step
starts now and the lag is counted (``RunnerStats.lag_dropped_seconds``).
The wall time each step really took, as the loop saw it (from the previous
step's end, or its own start after an idle wait, to its end, so the work
between two steps counts too), is summed in ``RunnerStats.step_seconds``
(``ferry_replica_step_seconds_total``): over a busy period it is the modelled
time plus the last step's lateness, which is what the control plane fits the
step parameters from.

Each submitted request gets a :class:`Ticket`; :meth:`EngineRunner.submit_prompt` is
how every face of a replica (the gRPC servicer, the HTTP face of
``tools.peers.replicaface``) turns a prompt into one, so a request's tokens,
cached tokens and answer do not depend on the face it came through. A ticket holds where its
answer ends (:class:`agent.replica.answer.Limit`: the engine generates that
many tokens, at least one), a counter of tokens not yet taken by its
consumer (never past the answer's words) and, at the end, the engine's
:class:`agent.replica.engine.Finished` summary; :meth:`Ticket.next` returns what
arrived since the last call. A consumer slower than the engine therefore
gets several steps' tokens in one delta: memory per request stays O(1)
whatever the pace of either side, and no token is lost.

Engine ids are assigned here (a counter), so clients' request ids may repeat.
Counters for the replica's Triton-style metrics (successes, failures by
reason, queue and compute time) are kept in :class:`RunnerStats`;
:meth:`EngineRunner.utilization` is the share of the last second spent in
steps (a bounded ring of recent steps).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

from agent.replica.answer import Limit, answer_limit
from agent.replica.engine import Engine, EngineRequest, Finished, StepResult, SubmitOutcome
from ferry.errors import InvalidArgument, Overloaded
from ferry.tokens import WHITESPACE, Tokenizer

CATCH_UP_SECONDS = 0.05  # a step's lateness up to this is taken off the next steps' sleeps; beyond, dropped
AIM_STEP = 10e-6  # how far the wake-ups' aim moves toward the timer's median lateness at each wake-up
MAX_AIM_SECONDS = 0.002  # a wake-up is aimed at most this much before a step's end


@dataclasses.dataclass
class RunnerStats:
    """Cumulative counters of a replica, in Triton's terms."""

    success: int = 0
    rejected: int = 0
    cancelled: int = 0
    queue_seconds: float = 0.0
    compute_seconds: float = 0.0
    last_inference: float = 0.0  # wall-clock seconds of the last completion
    step_seconds: float = 0.0  # wall time of finished steps as the loop saw it (module docstring)
    lag_dropped_seconds: float = 0.0  # lateness not caught up (over CATCH_UP_SECONDS)


class Ticket:
    """One request's view of the engine: tokens since the consumer's last look, then the summary.

    ``emitted`` counts the answer's words delivered so far: at most ``answer.words`` (a stop string at the very
    start leaves 0 words, though the engine generates one token).
    """

    def __init__(self, engine_id: str, max_tokens: int, answer: Limit | None = None) -> None:
        self.engine_id = engine_id
        self.max_tokens = max_tokens
        self.answer = answer or Limit(words=max_tokens, reason="length")
        self.emitted = 0
        self.finished: Finished | None = None
        self._pending = 0
        self._changed = asyncio.Event()

    def _deliver(self, tokens: int, finished: Finished | None) -> None:
        tokens = max(min(tokens, self.answer.words - self.emitted), 0)
        self._pending += tokens
        self.emitted += tokens
        if finished is not None:
            self.finished = finished
        self._changed.set()

    async def next(self) -> tuple[int, Finished | None]:
        """Wait for news: (tokens since the last call, the summary once the request is done)."""
        while self._pending == 0 and self.finished is None:
            self._changed.clear()
            await self._changed.wait()
        tokens, self._pending = self._pending, 0
        return tokens, self.finished


class EngineRunner:
    """Drives an engine in real time; :meth:`run` is the replica's engine task."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] | None = None,
                 retry_after_seconds: float = 0.5, tokenizer: Tokenizer = WHITESPACE) -> None:
        self.engine = engine
        self.tokenizer = tokenizer  # what prompts are counted and cut into blocks with (ferry.tokens)
        self.stats = RunnerStats()
        self._clock = clock or asyncio.get_running_loop().time
        self._retry_after = retry_after_seconds
        self._ids = itertools.count(1)
        self._tickets: dict[str, Ticket] = {}
        self._wake = asyncio.Event()
        self._recent: deque[tuple[float, float]] = deque(maxlen=4096)  # (end, duration) of recent steps
        self.slowdown = 1.0  # steps take this many times longer (fault injection: SIGUSR1 on ``ferry node``)
        self._aim = 0.0  # seconds a wake-up is aimed before a step's end: the timer's mean lateness, learnt

    def submit(self, prompt_tokens: int, max_tokens: int, block_hashes: tuple[int, ...],
               answer: Limit | None = None) -> Ticket:
        """Queue a request whose answer ends at ``answer`` (None: ``max_tokens``, ``length``); raises Overloaded
        (queue full) or InvalidArgument (it can never fit)."""
        engine_id = str(next(self._ids))
        output = 0 if answer is None else min(max(answer.words, 1), max_tokens)
        req = EngineRequest(request_id=engine_id, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                            block_hashes=block_hashes, output_tokens=output)
        admission = self.engine.submit(req, self._clock())
        if admission is SubmitOutcome.QUEUE_FULL:
            self.stats.rejected += 1
            raise Overloaded(f"replica queue full ({self.engine.params.max_queue} waiting)", self._retry_after)
        if admission is SubmitOutcome.TOO_LONG:
            self.stats.rejected += 1
            p = self.engine.params
            raise InvalidArgument("max_tokens", (
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the replica's "
                f"context ({p.max_context_tokens} tokens) or KV cache ({p.kv_blocks_total * p.kv_block_tokens})"))
        ticket = Ticket(engine_id, max_tokens, answer)
        self._tickets[engine_id] = ticket
        self._wake.set()
        return ticket

    def submit_prompt(self, prompt: str, max_tokens: int | None, *, stops: Sequence[str] = (),
                      ignore_eos: bool = False, prompt_field: str = "prompt",
                      script: tuple[str, ...] | None = None) -> tuple[Ticket, int]:
        """Queue ``prompt`` (every face of a replica admits prompts this way); returns the ticket and the prompt's
        tokens.

        Tokens are the runner's tokenizer (a model's ``tokenizer.json``, else
        whitespace words), cut into KV blocks of ``kv_block_tokens`` and hashed
        as the proxy does (:meth:`ferry.tokens.Tokenizer.encode`), so a proxy
        block of 512 tokens is whole engine blocks whenever the engine's block
        size divides 512, and with the default (512) the very same hashes.
        ``max_tokens`` None is the context left after the prompt (vLLM's
        default; InvalidArgument naming ``prompt_field`` when none is left).
        Where the answer ends (``ticket.answer``) is :func:`agent.replica.answer.answer_limit`
        of the prompt, the budget, ``stops``, ``ignore_eos`` and the answer's
        ``script`` (:mod:`agent.replica.model`; None: words), with the engine's
        ``answer_tokens`` settings.
        """
        params = self.engine.params
        encoded = self.tokenizer.encode(prompt, block_tokens=params.kv_block_tokens)
        if max_tokens is None:
            max_tokens = params.max_context_tokens - encoded.count
            if max_tokens < 1:
                raise InvalidArgument(prompt_field, f"prompt of {encoded.count} tokens leaves no room for an answer "
                                                    f"in the context of {params.max_context_tokens} tokens")
        answer = answer_limit(prompt, max_tokens, stops, params=params, ignore_eos=ignore_eos, script=script)
        return self.submit(encoded.count, max_tokens, encoded.hashes, answer), encoded.count

    def cancel(self, ticket: Ticket) -> None:
        """Stop a request that is not finished (its client went away); counted as cancelled."""
        if self._tickets.pop(ticket.engine_id, None) is not None and self.engine.cancel(ticket.engine_id):
            self.stats.cancelled += 1

    async def run(self) -> None:
        """Step the engine until cancelled, on the model's clock (see the module docstring)."""
        due: float | None = None  # when the previous step was due to end, while the engine is busy
        ended = 0.0  # when the previous step ended (its tokens were handed out after it: the next step's time)
        while True:
            started = self._clock()
            duration = self.engine.start_step(started)
            if duration is None:
                due = None
                self._wake.clear()
                await self._wake.wait()
                continue
            duration *= self.slowdown
            if due is None:
                begin = ended = started
            else:
                begin = due
            if started - begin > CATCH_UP_SECONDS:
                self.stats.lag_dropped_seconds += started - begin
                begin = started
            due = begin + duration
            wait = due - started - self._aim
            if wait > 0:
                await asyncio.sleep(wait)
                # the aim follows the median lateness of a wake-up (a host busy elsewhere makes some very late:
                # the median is the timer's own), one step per wake-up, bounded
                late = self._clock() - due
                self._aim = min(MAX_AIM_SECONDS, max(0.0, self._aim + (AIM_STEP if late > 0 else -AIM_STEP)))
            else:
                await asyncio.sleep(0)  # behind the model's clock: catch up, letting the consumers run
            now = self._clock()
            self.stats.step_seconds += now - ended
            ended = now
            self._recent.append((now, duration))
            self._deliver(self.engine.finish_step(now))

    def utilization(self, window: float = 1.0) -> float:
        """Share of the last ``window`` seconds the engine spent in steps (its GPU utilization), 0..1."""
        since = self._clock() - window
        busy = sum(min(duration, end - since) for end, duration in self._recent if end > since)
        return min(1.0, busy / window)

    def _deliver(self, result: StepResult) -> None:
        done = {f.request_id: f for f in result.finished}
        now = time.time()
        for engine_id, tokens in result.tokens.items():
            ticket = self._tickets.get(engine_id)
            finished = done.get(engine_id)
            if finished is not None:
                self._tickets.pop(engine_id, None)
                self.stats.success += 1
                self.stats.queue_seconds += finished.queue_seconds
                self.stats.compute_seconds += finished.service_seconds
                self.stats.last_inference = now
            if ticket is not None:
                ticket._deliver(tokens, finished)
