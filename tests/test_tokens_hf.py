"""Tokenizer files (ferry.tokens): counts, block hashes, the per-model registry, the catalog's field.

Tokenizers are built in-process with the ``tokenizers`` library (a
WordLevel model over a few sentences, split on words and punctuation), saved
to ``tmp_path``: no download.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.pick.prefix import leading_hashes
from ferry.config import parse
from ferry.tokens import (
    WHITESPACE,
    Tokenizer,
    Tokenizers,
    block_hashes,
    chain_ids,
    load_tokenizer,
    tokenizer_label,
)

SENTENCES = [
    "hello, world! the router sends each prompt to a replica.",
    "a replica holds the prefix of a prompt in its cache; hello again.",
    "tokens, blocks and hashes: the proxy and the engine agree!",
]


def make_tokenizer(path: Path) -> Path:
    """A WordLevel tokenizer trained on :data:`SENTENCES` (words and punctuation apart), saved at ``path``."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    hf = HfTokenizer(models.WordLevel(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator(SENTENCES, trainer=trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    hf.save(str(path))
    return path


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    return make_tokenizer(tmp_path / "tokenizer.json")


def test_counts_are_the_models_tokens_not_words(tokenizer_file: Path) -> None:
    t = load_tokenizer(tokenizer_file)
    assert t.kind == "hf" and t.name.startswith("hf:tokenizer.json@") and len(t.name) == len("hf:tokenizer.json@") + 12
    assert t.count("hello, world!") == 4 and WHITESPACE.count("hello, world!") == 2
    assert t.ids("hello, world!") == t.ids("hello , world !")  # the same tokens however spaced


def test_block_hashes_of_ids_chain_and_agree_on_shared_prefixes(tokenizer_file: Path) -> None:
    t = load_tokenizer(tokenizer_file)
    a = t.encode("hello, world! the router sends each prompt", block_tokens=2)
    b = t.encode("hello, world! the proxy sends", block_tokens=2)
    assert a.count == 9 and len(a.hashes) == 5
    assert a.hashes[:2] == b.hashes[:2] and a.hashes[2] != b.hashes[2]  # blocks 1-2 shared, block 3 differs
    assert a.hashes == tuple(chain_ids(t.ids("hello, world! the router sends each prompt"), 2))
    assert t.encode("hello, world! the router sends each prompt", blocks=2, block_tokens=2).hashes == a.hashes[:2]
    assert t.encode("hello", blocks=0).hashes == ()


def test_whitespace_encoding_is_unchanged() -> None:
    text = " ".join(f"w{i}" for i in range(1300))
    encoded = WHITESPACE.encode(text)
    assert encoded.count == 1300 and list(encoded.hashes) == block_hashes(text)
    assert list(WHITESPACE.encode(text, blocks=2).hashes) == leading_hashes(text.split(), 2)


def test_registry_loads_each_file_once_and_falls_back_to_words(tokenizer_file: Path) -> None:
    tokenizers = Tokenizers.load([("a", str(tokenizer_file)), ("b", str(tokenizer_file)), ("c", "")])
    assert tokenizers.get("a") is tokenizers.get("b") and tokenizers.get("a").kind == "hf"
    assert tokenizers.get("c") is WHITESPACE and tokenizers.get("unknown") is WHITESPACE
    assert set(tokenizers.names()) == {"a", "b"}


def test_a_missing_or_bad_file_names_the_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model 'chat'.*tokenizer"):
        Tokenizers.load([("chat", str(tmp_path / "absent.json"))])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="model 'chat'.*not a tokenizer.json"):
        Tokenizers.load([("chat", str(tmp_path / "bad.json"))])


def test_catalog_field_and_label(tokenizer_file: Path) -> None:
    config = parse({"models": [{"name": "chat", "tokenizer": str(tokenizer_file)}, {"name": "words"}]})
    chat, words = config.models
    assert chat.tokenizer == str(tokenizer_file) and words.tokenizer == ""
    assert tokenizer_label(chat.tokenizer) == load_tokenizer(tokenizer_file).name
    assert tokenizer_label("") == "whitespace"
    assert tokenizer_label(str(tokenizer_file.parent / "gone.json")) == "hf:gone.json@unreadable"


def test_tokenizer_is_plain_words_without_a_file() -> None:
    assert Tokenizer("whitespace").kind == "whitespace"
    with pytest.raises(ValueError):
        WHITESPACE.ids("no ids")


def test_the_model_view_names_the_tokenizer_in_use(tokenizer_file: Path) -> None:
    from controlplane.tables.views import model_views
    from ferry.config import ModelConfig
    from ferry_cli.ctl.views import model_row

    models = [ModelConfig(name="chat", tokenizer=str(tokenizer_file)), ModelConfig(name="words")]
    views = model_views([], models, {}, allocations={}, pending=[])
    rows = {row["model"]: row["tokenizer"] for row in map(model_row, views)}
    assert rows == {"chat": load_tokenizer(tokenizer_file).name, "words": "whitespace"}
