"""Prompt tokens and prefix blocks, shared by replicas, proxies and tools.

Tokens are whitespace-separated words. A prompt is cut into blocks of
``block_tokens`` tokens (512, as in the Mooncake trace); each block's hash is
chained with the one before (``h_i = blake2b(h_{i-1} || block_i)``, 64 bits),
so two prompts have equal hashes up to block *i* exactly when they share
their first *i* blocks. The last block may be partial, as in the trace.

:func:`block_text` does the reverse for trace replay: it maps a trace's block
id to a fixed run of words, so requests that share leading block ids in a
trace share the same leading text, and hence the same chained hashes.

Cost: O(prompt length) for splitting and hashing.
"""

from __future__ import annotations

import hashlib

BLOCK_TOKENS = 512


def tokenize(text: str) -> list[str]:
    """Whitespace tokens of ``text``."""
    return text.split()


def count_tokens(text: str) -> int:
    """Number of whitespace tokens in ``text``."""
    return len(text.split())


def chain_hashes(tokens: list[str], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Chained 64-bit hashes of consecutive blocks of ``tokens`` (last block may be partial)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    hashes: list[int] = []
    prev = b""
    for start in range(0, len(tokens), block_tokens):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(" ".join(tokens[start:start + block_tokens]).encode())
        prev = h.digest()
        hashes.append(int.from_bytes(prev, "big"))
    return hashes


def block_hashes(text: str, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Chained block hashes of a prompt's text."""
    return chain_hashes(tokenize(text), block_tokens)


def blocks_for(tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """KV-cache blocks needed to hold ``tokens`` tokens."""
    return -(-max(tokens, 0) // block_tokens)


def block_text(block_id: int, block_tokens: int = BLOCK_TOKENS) -> str:
    """A fixed run of ``block_tokens`` short words that stands for a trace's block id."""
    seed = hashlib.blake2b(str(block_id).encode(), digest_size=8).hexdigest()
    return " ".join(f"{seed[i % 16]}{block_id:x}{i:x}" for i in range(block_tokens))


def prompt_from_blocks(block_ids: list[int], input_tokens: int, block_tokens: int = BLOCK_TOKENS) -> str:
    """A prompt of ``input_tokens`` words whose blocks are those of ``block_ids``, in order."""
    words: list[str] = []
    for block_id in block_ids:
        if len(words) >= input_tokens:
            break
        words.extend(block_text(block_id, block_tokens).split())
    while len(words) < input_tokens:  # trace rows whose ids do not cover the length
        words.extend(block_text(-len(words) - 1, block_tokens).split())
    return " ".join(words[:input_tokens])
