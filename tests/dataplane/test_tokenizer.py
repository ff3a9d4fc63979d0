"""The proxy counts and hashes prompts with each model's tokenizer file (dataplane.intake.tokenwork).

Validation uses the model's tokens for counts and prefix blocks; large
prompts are encoded in a worker thread, bounded; a real proxy in process
reports the tokenizer's counts when the replica reports none.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from dataplane.intake.tokenwork import TokenWork
from dataplane.intake.validate import validate_request
from ferry.config import Limits
from ferry.errors import Overloaded
from ferry.tokens import WHITESPACE, Tokenizers, load_tokenizer
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour
from tests.test_tokens_hf import make_tokenizer

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def tokenizers(tmp_path: Path) -> Tokenizers:
    return Tokenizers.load([("m", str(make_tokenizer(tmp_path / "tokenizer.json")))])


def test_validation_counts_and_hashes_the_models_tokens(tokenizers: Tokenizers) -> None:
    t = tokenizers.get("m")
    valid = validate_request(request(prompt="hello, world!"), Limits(), tokenizer=t)
    assert valid.prompt_tokens == 4 and valid.prefix_hashes == t.encode("hello, world!", blocks=16).hashes
    words = validate_request(request(prompt="hello, world!"), Limits())
    assert words.prompt_tokens == 2 and words.prefix_hashes != valid.prefix_hashes
    keyed = validate_request(request(prompt="hello, world!", prefix_key="k"), Limits(), tokenizer=t)
    assert keyed.prompt_tokens == 4 and keyed.prefix_hashes == ()


def test_validation_takes_an_encoding_done_before() -> None:
    from ferry.tokens import Encoded
    valid = validate_request(request(prompt="a b c"), Limits(), encoded=Encoded(7, (1, 2)))
    assert (valid.prompt_tokens, valid.prefix_hashes) == (7, (1, 2))


async def test_large_text_is_encoded_in_a_worker_thread(tokenizers: Tokenizers) -> None:
    work = TokenWork(tokenizers, offload_chars=64)
    t = tokenizers.get("m")
    try:
        small = await work.encode(t, "hello, world!", blocks=16)
        assert small.count == 4 and work.offloaded == 0
        text = "hello, world! " * 10
        large = await work.encode(t, text, blocks=16)
        assert large == t.encode(text, blocks=16) and work.offloaded == 1 and work.pending == 0
        assert await work.count(t, text) == 40 and work.offloaded == 2
        assert await work.count(WHITESPACE, text) == 20 and work.offloaded == 2  # words: always inline
    finally:
        work.close()


async def test_offloaded_encodes_are_bounded(tokenizers: Tokenizers) -> None:
    work = TokenWork(tokenizers, offload_chars=1, max_pending=1, retry_after=0.5)
    t = tokenizers.get("m")
    try:
        first = asyncio.ensure_future(work.count(t, "hello, world! " * 2000))
        await asyncio.sleep(0)  # let it take the one slot (it runs in a thread)
        assert work.pending == 1
        with pytest.raises(Overloaded) as refused:
            await work.count(t, "hello")
        assert refused.value.retry_after == 0.5
        assert await first == 8000
    finally:
        work.close()


async def test_a_proxy_counts_with_the_tokenizer_when_the_replica_reports_none(rig: Any,
                                                                               tokenizers: Tokenizers) -> None:
    r = await rig({"r1": Behaviour(report=False)}, tokenizers=tokenizers)
    reply = await r.stub.Infer(request(prompt="hello, world!", max_tokens=3), metadata=PAID, timeout=5)
    # The fake answers "r1w0 r1w1 r1w2": unknown to the vocabulary, one token each
    assert reply.prompt_tokens == 4 and reply.completion_tokens == 3
    chunks = [c async for c in r.stub.InferStream(request(prompt="hello, world! again.", max_tokens=3),
                                                  metadata=PAID, timeout=5)]
    assert chunks[-1].summary.prompt_tokens == 6
    # "r1c0 r1c1 r1c2 " is 3 tokens as words; the tokenizer splits none of them further
    assert chunks[-1].summary.completion_tokens == 3


async def test_a_large_prompt_is_encoded_off_the_loop_end_to_end(rig: Any, tokenizers: Tokenizers) -> None:
    r = await rig({"r1": Behaviour(report=False)}, tokenizers=tokenizers)
    assert r.proxy is not None
    r.proxy.router.tokens.offload_chars = 32
    prompt = "hello, world! " * 8
    reply = await r.stub.Infer(request(prompt=prompt, max_tokens=2), metadata=PAID, timeout=5)
    assert reply.prompt_tokens == 32 and r.proxy.router.tokens.offloaded == 1
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # no key: refused before any encoding
        await r.stub.Infer(request(prompt=prompt, max_tokens=2), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED and r.proxy.router.tokens.offloaded == 1


def test_the_tokenizer_name_is_stable(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path / "tokenizer.json")
    assert load_tokenizer(path).name == load_tokenizer(path).name


async def test_a_full_tokenizer_never_refuses_an_answer(rig: Any, tokenizers: Tokenizers) -> None:
    r = await rig({"r1": Behaviour(report=False)}, tokenizers=tokenizers)
    assert r.proxy is not None
    work = r.proxy.router.tokens
    work.offload_chars, work.max_pending = 10, 1
    work.pending = 1  # the one slot taken
    try:  # a short prompt is encoded inline; its completion (14 characters) keeps the words counted
        reply = await r.stub.Infer(request(prompt="hi", max_tokens=3), metadata=PAID, timeout=5)
        assert reply.completion_tokens == 3 and work.offloaded == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a large prompt waits for no one: refused
            await r.stub.Infer(request(prompt="hello, world! hello", max_tokens=3), metadata=PAID, timeout=5)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(refused.value.trailing_metadata())["retry-after"] == "1"
    finally:
        work.pending = 0
