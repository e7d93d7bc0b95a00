"""Session-wide tiny models and text, built once offline (see ralm/tiny.py)."""

from __future__ import annotations

import contextlib
import os
import signal
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
def tiny_llama_dir(tmp_path_factory, wiki_text) -> Path:
    """A 2-layer, 32-wide Llama (grouped-query attention) whose tokenizer adds a BOS token."""
    from ralm.tiny import make_llama, train_bos_tokenizer

    d = tmp_path_factory.mktemp("tiny_llama")
    tok = train_bos_tokenizer([wiki_text], d, vocab_size=400)
    make_llama(d, tok, seed=0)
    return d


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, wiki_text) -> Path:
    """A 2-layer, 32-wide BERT encoder with an uncased WordPiece tokenizer (token type ids)."""
    from ralm.tiny import make_bert

    d = tmp_path_factory.mktemp("tiny_bert")
    make_bert(d, [wiki_text], seed=0)
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


@pytest.fixture(scope="session")
def bm25_corpus(tmp_path_factory) -> dict:
    """A real Lucene BM25 index of 300 pseudo-WikiText articles (~900 passages), built once via the
    ``ralm.corpus`` CLI. Keys: ``text``, ``index`` (Path), ``jsonl`` (Path), ``n_passages``.

    Any test that searches starts the process-wide JVM; never fork after that.
    """
    from ralm.corpus import main
    from ralm.tiny import wikitext_articles

    d = tmp_path_factory.mktemp("bm25")
    text = wikitext_articles(n_articles=300, seed=1)
    (d / "corpus.txt").write_text(text, encoding="utf-8")
    assert main(["--text.file", str(d / "corpus.txt"), "--out", str(d), "--threads", "2"]) == 0
    n = sum(1 for f in (d / "jsonl").glob("*.jsonl") for _ in open(f, encoding="utf-8"))
    return {"text": text, "index": d / "index", "jsonl": d / "jsonl", "n_passages": n}


def write_rerank_shards(out_dir, n: int = 48, k: int = 4, seed: int = 0, shards: int = 2, short_every: int = 7):
    """Write reranker training data in data_gen's parquet layout (random but well-formed).

    Every ``short_every``-th example has fewer than ``k`` candidates, to exercise padding.
    """
    import json
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ralm.tiny import wikitext_articles

    rng = random.Random(seed)
    words = wikitext_articles(n_articles=3, seed=seed).split()

    def text(m):
        s = rng.randrange(len(words) - m)
        return " ".join(words[s: s + m])

    rows = []
    for i in range(n):
        kk = max(1, k - 2) if i % short_every == 0 else k
        titles = [text(2) for _ in range(kk)]
        rows.append(dict(
            id=1000 + 3 * i, source_title=text(2), position=rng.randrange(10_000),
            prefix_text=text(rng.randint(5, 80)), prefix_ids=[rng.randrange(500) for _ in range(8)],
            target_ids=[rng.randrange(500) for _ in range(4)], target_text=text(4), query=text(10),
            doc_ids=[str(rng.randrange(10**6)) for _ in range(kk)], doc_titles=titles,
            doc_texts=[f"{t}\n{text(rng.randint(20, 60))}" for t in titles],
            bm25_scores=sorted((rng.uniform(5, 20) for _ in range(kk)), reverse=True),
            lm_logprobs=[rng.uniform(-60, -5) for _ in range(kk)], nodoc_logprob=rng.uniform(-60, -5)))
    from ralm.schema import TRAINING_SCHEMA as schema

    for r in rows:
        r.update(n_candidates=len(r["doc_texts"]), note="")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per = -(-n // shards)
    for s in range(shards):
        pq.write_table(pa.Table.from_pylist(rows[s * per: (s + 1) * per], schema=schema), out / f"shard-{s:05d}.parquet")
    (out / "manifest.json").write_text(json.dumps({"k": k, "examples": n, "note": "test data"}))
    return out


@pytest.fixture(scope="session")
def rerank_data_dir(tmp_path_factory) -> Path:
    """48 reranker training examples (k=4, some with fewer candidates) in two parquet shards."""
    return write_rerank_shards(tmp_path_factory.mktemp("rerank_data"), n=48, k=4, seed=0)


@pytest.fixture(scope="session", autouse=True)
def no_jvm_in_the_test_process():
    """The JVM lives only in search processes (ralm/search_process.py), never in a process that also
    runs torch: the suite checks that nothing started one inside pytest."""
    yield
    from ralm.java import jvm_pid

    assert jvm_pid() is None, "a test started the JVM inside the pytest process; search via SearchProcess"


@pytest.fixture
def paused():
    """``with paused(proc):`` the block runs while ``proc``'s process group is stopped (SIGSTOP: it keeps its
    locks and files), so a test of "a second run is refused" does not race the first run's end against the
    second's start-up. A group that has already ended is left alone (the test's own assert says so)."""
    @contextlib.contextmanager
    def pause(proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
    return pause
