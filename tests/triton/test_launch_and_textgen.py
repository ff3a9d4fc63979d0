"""The parts of tools/triton that need no server: what the models compute, and the launcher's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.triton import textgen
from tools.triton.launch import TritonEnvironmentMissing, free_ports, pid_alive, start_triton

pytestmark = [pytest.mark.triton, pytest.mark.timeout(10)]


def test_batchstring_is_one_output_per_input_in_order() -> None:
    assert textgen.batchstring(["a", "b c", ""]) == ["A", "B C", ""]


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "words"),
    [
        ("hello world", 5, ["hello", "world", "hello", "world", "hello"]),
        ("  one  ", 2, ["one", "one"]),
        ("", 2, ["token", "token"]),
        ("a b", 0, []),
        ("a b", -3, []),
    ],
    ids=["cycles", "strips", "empty-prompt", "zero", "negative"],
)
def test_generate_words(prompt: str, max_tokens: int, words: list[str]) -> None:
    assert textgen.generate_words(prompt, max_tokens) == words


def test_generate_words_is_bounded() -> None:
    assert len(textgen.generate_words("x", 10**9)) == textgen.MAX_TOKENS_LIMIT


def test_stream_chunks_concatenate_to_the_unary_text() -> None:
    words = textgen.generate_words("the quick brown fox", 7)
    chunks = textgen.stream_chunks(words)
    assert len(chunks) == 7
    assert chunks[:2] == ["the", " quick"]
    assert "".join(chunks) == textgen.unary_text(words)


def test_start_triton_without_the_environment_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(TritonEnvironmentMissing, match=r"tools/triton/setup_env\.sh"):
        start_triton(tmp_path, venv=tmp_path / "no-such-venv")


def test_free_ports_are_distinct() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


def test_pid_alive() -> None:
    import os

    assert pid_alive(os.getpid())
    assert not pid_alive(None)
    assert not pid_alive(2**22 + 1)  # above the default pid_max
