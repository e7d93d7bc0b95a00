"""Session-wide tiny models and text, built once offline (see ralm/tiny.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def wiki_text() -> str:
    """~20 WikiText-shaped articles of pseudo-English (about 10k GPT-2-ish tokens)."""
    from ralm.tiny import wikitext_articles

    return wikitext_articles(n_articles=20, seed=0)


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, wiki_text) -> Path:
    """A 2-layer, 32-wide GPT-2 with a 512-token BPE vocabulary trained on ``wiki_text``."""
    from ralm.tiny import make_gpt2, train_tokenizer

    d = tmp_path_factory.mktemp("tiny_gpt2")
    tok = train_tokenizer([wiki_text], d, vocab_size=512, kind="gpt2")
    make_gpt2(d, tok, n_layer=2, n_embd=32, n_head=2, n_positions=1024, seed=0)
    return d


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory, wiki_text) -> Path:
    """A 2-layer, 32-wide RoBERTa encoder with its own locally trained tokenizer."""
    from ralm.tiny import make_roberta, train_tokenizer

    d = tmp_path_factory.mktemp("tiny_roberta")
    tok = train_tokenizer([wiki_text], d, vocab_size=600, kind="roberta")
    make_roberta(d, tok, num_hidden_layers=2, hidden_size=32, num_attention_heads=2, seed=0)
    return d


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` (real WikiText and the GPT-2 tokenizer); absent on a user's fresh clone."""
    if not (SHARED / "data").is_dir():
        pytest.skip(f"needs the team's shared data folder at {SHARED} (not part of a fresh clone)")
    return SHARED
