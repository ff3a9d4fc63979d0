"""Prompt tokens and prefix blocks, shared by replicas, proxies and tools.

Tokens are a model's own tokens when its catalog entry names a Hugging Face
``tokenizer.json`` (:class:`Tokenizer`, loaded with the ``tokenizers``
library; :class:`Tokenizers` holds one per model), else whitespace-separated
words (:data:`WHITESPACE`, the fallback). A prompt is cut into blocks of
``block_tokens`` tokens (512, as in the Mooncake trace); each block's hash is
chained with the one before (``h_i = blake2b(h_{i-1} || block_i)``, 64 bits),
so two prompts have equal hashes up to block *i* exactly when they share
their first *i* blocks. The last block may be partial, as in the trace.

:func:`block_text` does the reverse for trace replay: it maps a trace's block
id to a fixed run of words, so requests that share leading block ids in a
trace share the same leading text, and hence the same chained hashes.

Words are hashed as their text joined by spaces; token ids as their 32-bit
little-endian bytes (:func:`chain_ids`), so a proxy and a replica that use the
same tokenizer and block size agree block for block.

Cost: O(prompt length) for splitting and hashing; a ``tokenizers`` encode is
O(prompt length) too but heavier (``python -m tools.bench.tokens``).
"""

from __future__ import annotations

import array
import dataclasses
import functools
import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 512


def tokenize(text: str) -> list[str]:
    """Whitespace tokens of ``text``."""
    return text.split()


def count_tokens(text: str) -> int:
    """Number of whitespace tokens in ``text``."""
    return len(text.split())


def chain_hashes(tokens: list[str], block_tokens: int = BLOCK_TOKENS, blocks: int | None = None) -> list[int]:
    """Chained 64-bit hashes of consecutive blocks of ``tokens`` (last block may be partial), of the first
    ``blocks`` blocks only when given (no copy of the tokens: each block is sliced once)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    hashes: list[int] = []
    prev = b""
    end = len(tokens) if blocks is None else min(len(tokens), blocks * block_tokens)
    for start in range(0, end, block_tokens):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(" ".join(tokens[start:start + block_tokens]).encode())
        prev = h.digest()
        hashes.append(int.from_bytes(prev, "big"))
    return hashes


SKETCH_TOKENS = 16  # tokens read at each end of a block by a sketch hash (sketch_hashes)


def sketch_hashes(tokens: Sequence[str] | Sequence[int], first: int, blocks: int, prev: int,
                  block_tokens: int = BLOCK_TOKENS, edge: int = SKETCH_TOKENS) -> list[int]:
    """Chained 64-bit **sketch** hashes of blocks ``first`` to ``blocks - 1`` of ``tokens`` (words or token ids),
    chained from ``prev``, the hash of block ``first - 1``.

    A sketch reads the block's first and last ``edge`` tokens and its length, not all its tokens, and hashes
    them with CRC-32 (the low 32 bits) and Adler-32 (the high), each started from the previous hash's half:
    about 2 µs a block where :func:`chain_hashes` takes about 7, so that a recorded request can carry a hash
    for every block of a long prompt (the traffic recorder, ``dataplane.record``). Equal prefixes hash alike
    and a change shows from the block it is in, unless it lies wholly inside one block's middle and the
    chains up to that block are equal: then the two prompts look alike from there (conversations that grow
    by appending never do that). Not for security: an identity for the simulator's prefix cache.
    """
    out: list[int] = []
    end = min(len(tokens), blocks * block_tokens)
    for start in range(first * block_tokens, end, block_tokens):
        stop = min(start + block_tokens, end)
        head, tail = tokens[start:min(start + edge, stop)], tokens[max(start + edge, stop - edge):stop]
        if head and isinstance(head[0], int):
            payload = array.array("I", head).tobytes() + b"\x00" + array.array("I", tail).tobytes()
        else:
            payload = f"{' '.join(head)}\x00{' '.join(tail)}".encode()  # type: ignore[arg-type]
        payload += (stop - start).to_bytes(4, "big")
        prev = (zlib.adler32(payload, (prev >> 32) & 0xFFFF_FFFF) << 32) | zlib.crc32(payload, prev & 0xFFFF_FFFF)
        out.append(prev)
    return out


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


def chain_ids(ids: list[int], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Chained 64-bit hashes of consecutive blocks of token ``ids`` (each id as 4 little-endian bytes)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    hashes: list[int] = []
    prev = b""
    for start in range(0, len(ids), block_tokens):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(array.array("I", ids[start:start + block_tokens]).tobytes())
        prev = h.digest()
        hashes.append(int.from_bytes(prev, "big"))
    return hashes


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """A prompt as routing needs it: its token count and the chained hashes of its leading blocks."""

    count: int
    hashes: tuple[int, ...] = ()


class Tokenizer:
    """One model's tokens: whitespace words (``hf`` None) or a Hugging Face ``tokenizers`` tokenizer.

    ``name`` is what operators see (``whitespace``, or ``hf:<file name>@<sha256 prefix>``).
    Encoding adds the tokenizer's special tokens, as an engine does to a prompt;
    it goes through ``encode_batch_fast`` (no character offsets, about 3x
    cheaper than ``encode``, and it releases the GIL, so worker threads run it
    beside the event loop).
    """

    def __init__(self, name: str, hf: Any = None) -> None:
        self.name = name
        self.hf = hf  # a tokenizers.Tokenizer

    @property
    def kind(self) -> str:
        """``hf`` or ``whitespace``."""
        return "whitespace" if self.hf is None else "hf"

    def ids(self, text: str) -> list[int]:
        """The token ids of ``text`` (only for an ``hf`` tokenizer)."""
        if self.hf is None:
            raise ValueError("a whitespace tokenizer has no ids")
        ids: list[int] = self.hf.encode_batch_fast([text])[0].ids  # no offsets; releases the GIL
        return ids

    def decode(self, ids: list[int]) -> str | None:
        """The text of token ``ids`` (an ``hf`` tokenizer; an id it does not know raises ValueError), or None: a
        whitespace tokenizer has no ids to decode."""
        if self.hf is None:
            return None
        try:
            text: str = self.hf.decode(ids, skip_special_tokens=False)
        except Exception as exc:  # the tokenizers library raises its own error type for an id it does not know
            raise ValueError(str(exc)) from None
        return text

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        return len(text.split()) if self.hf is None else len(self.ids(text))

    def encode(self, text: str, *, blocks: int | None = None, block_tokens: int = BLOCK_TOKENS,
               tail: int = 0) -> Encoded:
        """The count of ``text`` and the chained hashes of its first ``blocks`` blocks (None: all; 0: none), then
        :func:`sketch_hashes` of the blocks after them up to ``tail`` blocks in all (0: none)."""
        tokens: list[str] | list[int]
        if self.hf is None:
            tokens = text.split()
            hashes = chain_hashes(tokens, block_tokens, blocks) if blocks != 0 else []
        else:
            tokens = self.ids(text)
            head = tokens if blocks is None else tokens[:blocks * block_tokens]
            hashes = chain_ids(head, block_tokens) if head else []
        if blocks and tail > blocks and len(hashes) == blocks:
            hashes += sketch_hashes(tokens, blocks, tail, hashes[-1], block_tokens)
        return Encoded(len(tokens), tuple(hashes))


WHITESPACE = Tokenizer("whitespace")
MAX_TOKENIZERS = 64  # distinct tokenizer files one process loads at most


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A Hugging Face ``tokenizer.json`` at ``path``; raises OSError or ValueError when it cannot be read."""
    from tokenizers import Tokenizer as HfTokenizer  # imported on first use: processes without one never load it

    data = Path(path).read_bytes()
    try:
        hf = HfTokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # the library raises its own exception type
        raise ValueError(f"not a tokenizer.json: {exc}") from exc
    return Tokenizer(_name(path, data), hf)


def _name(path: str | Path, data: bytes) -> str:
    return f"hf:{Path(path).name}@{hashlib.sha256(data).hexdigest()[:12]}"


@functools.lru_cache(maxsize=MAX_TOKENIZERS)
def tokenizer_label(path: str) -> str:
    """What operators see for a catalog's ``tokenizer`` path: ``whitespace`` (none), the name a loaded
    :class:`Tokenizer` would have, or ``hf:<file>@unreadable``; the file is read once per path."""
    if not path:
        return WHITESPACE.name
    try:
        return _name(path, Path(path).read_bytes())
    except OSError:
        return f"hf:{Path(path).name}@unreadable"


class Tokenizers:
    """The tokenizer of each model of a catalog; a model it does not name gets :data:`WHITESPACE`.

    Built once from ``(model, path)`` pairs (an empty path: whitespace); a
    file named by several models is loaded once. Bounded by the catalog, and
    at most :data:`MAX_TOKENIZERS` distinct files (ValueError past it).
    """

    def __init__(self, by_model: Mapping[str, Tokenizer] | None = None) -> None:
        self._by_model: dict[str, Tokenizer] = dict(by_model or {})

    @classmethod
    def load(cls, paths: Iterable[tuple[str, str]]) -> Tokenizers:
        """Load each model's file; raises ValueError naming the model whose file is missing or bad."""
        files: dict[str, Tokenizer] = {}
        by_model: dict[str, Tokenizer] = {}
        for model, path in paths:
            if not path:
                continue
            key = str(Path(path).resolve())
            if key not in files:
                if len(files) >= MAX_TOKENIZERS:
                    raise ValueError(f"model {model!r}: more than {MAX_TOKENIZERS} tokenizer files")
                try:
                    files[key] = load_tokenizer(path)
                except (OSError, ValueError) as exc:
                    raise ValueError(f"model {model!r}: tokenizer {path}: {exc}") from exc
            by_model[model] = files[key]
        return cls(by_model)

    def get(self, model: str) -> Tokenizer:
        """The tokenizer of ``model`` (whitespace when it has none)."""
        return self._by_model.get(model, WHITESPACE)

    def names(self) -> dict[str, str]:
        """Model → tokenizer name, for the models that have a file."""
        return {model: t.name for model, t in self._by_model.items()}
