"""Tokenization at the proxy: each model's tokenizer, and large prompts encoded off the event loop.

:class:`TokenWork` holds the per-model tokenizers (:class:`ferry.tokens.Tokenizers`,
loaded once from the proxy's own ``[[models]]`` catalog; a model without a
file counts whitespace words) and runs an encode either inline or in a
small pool of worker threads. Measured with ``python -m tools.bench.tokens``
(a byte-level BPE, 2 cores shared with other work): 60 to 90 µs for a
64-token prompt, 1 to 4 ms for 1k tokens and 30 to 50 ms for 8k tokens,
against 40 to 55 µs for a round trip through a worker thread; the library releases the GIL while it encodes, so
the loop keeps serving meanwhile. An 8k prompt inline would stall every
other request for tens of ms, a short one costs less than the hop. So text
of at least ``offload_chars`` characters (4,096, about 1k tokens) with a
Hugging Face tokenizer goes to one of ``workers`` threads (2, the machine's
cores); whitespace counting stays inline (a split: 0.4 to 0.6 ms for 8k
words, as before).

Bounded: at most ``max_pending`` (64) encodes waiting or running in the
threads; past it :meth:`encode` and :meth:`count` raise
:class:`ferry.errors.Overloaded` with a retry-after (RESOURCE_EXHAUSTED at
the servicer), never an unbounded queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools

from ferry.errors import Overloaded
from ferry.tokens import BLOCK_TOKENS, Encoded, Tokenizer, Tokenizers

OFFLOAD_CHARS = 4096


class TokenWork:
    """Per-model tokenizers and where their work runs; see the module docstring."""

    def __init__(self, tokenizers: Tokenizers | None = None, *, offload_chars: int = OFFLOAD_CHARS, workers: int = 2,
                 max_pending: int = 64, retry_after: float = 1.0) -> None:
        if workers < 1 or max_pending < 1 or offload_chars < 0:
            raise ValueError("workers and max_pending must be positive, offload_chars >= 0")
        self.tokenizers = tokenizers or Tokenizers()
        self.offload_chars, self.max_pending, self.retry_after = offload_chars, max_pending, retry_after
        self._workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # started on first offload
        self.pending = 0
        self.offloaded = 0  # encodes run in a worker thread, for tests and diagnostics

    def tokenizer(self, model: str) -> Tokenizer:
        """The tokenizer of ``model`` (whitespace when the catalog names no file)."""
        return self.tokenizers.get(model)

    def offloads(self, tokenizer: Tokenizer, size: int) -> bool:
        """Whether text of ``size`` characters is encoded in a worker thread."""
        return tokenizer.hf is not None and size >= self.offload_chars

    async def _run(self, fn: functools.partial[Encoded] | functools.partial[int]) -> Encoded | int:
        if self.pending >= self.max_pending:
            raise Overloaded(f"tokenizer busy ({self.pending} prompts being encoded)", self.retry_after)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="ferry-tokens")
        self.pending += 1
        self.offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            self.pending -= 1

    async def encode(self, tokenizer: Tokenizer, text: str, *, blocks: int,
                     block_tokens: int = BLOCK_TOKENS, tail: int = 0) -> Encoded:
        """``tokenizer.encode(text)`` with the hashes of ``blocks`` leading blocks (and sketches up to ``tail``),
        off the loop when large."""
        if not self.offloads(tokenizer, len(text)):
            return tokenizer.encode(text, blocks=blocks, block_tokens=block_tokens, tail=tail)
        found = await self._run(functools.partial(tokenizer.encode, text, blocks=blocks, block_tokens=block_tokens,
                                                  tail=tail))
        assert isinstance(found, Encoded)
        return found

    async def count(self, tokenizer: Tokenizer, text: str) -> int:
        """Tokens of ``text``, off the loop when large."""
        if not self.offloads(tokenizer, len(text)):
            return tokenizer.count(text)
        found = await self._run(functools.partial(tokenizer.count, text))
        assert isinstance(found, int)
        return found

    def close(self) -> None:
        """Stop the worker threads (running encodes finish)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
